-- Issue 37: a file fetched from Xet storage is fetched by reconstruction,
-- term by term. Each term is recorded once its xorb range was fetched and
-- decoded, before its bytes are handed to the transfer (which claims them
-- in the ledger only after they are fsynced): where the term lies in the
-- file, which chunks of which xorb it is, and each chunk's Xet hash and
-- length ("<64 hex>:<length>" per line, in order). The file's Xet hash is
-- checked against these before publish; a later revision can find its
-- unchanged chunks here by hash.
--
-- A term is keyed by where it starts in the file at one Xet hash: asked
-- again (a resume, an expired URL) it is the same term and its row is
-- replaced, `fetched` adding up the compressed bytes every fetch of it
-- brought, `decoded` the bytes they decoded to, and `skipped` those of
-- them outside the span asked (the head of a term before a resumed
-- watermark, the tail after a range's end), never handed to the transfer.

CREATE TABLE xet_terms (
    path        TEXT    NOT NULL,
    xet_hash    TEXT    NOT NULL CHECK (length(xet_hash) = 64),
    file_start  INTEGER NOT NULL CHECK (file_start >= 0),
    file_end    INTEGER NOT NULL CHECK (file_end > file_start),
    xorb        TEXT    NOT NULL,
    chunk_start INTEGER NOT NULL CHECK (chunk_start >= 0),
    chunk_end   INTEGER NOT NULL CHECK (chunk_end > chunk_start),
    chunks      TEXT    NOT NULL,
    fetched     INTEGER NOT NULL CHECK (fetched >= 0),
    decoded     INTEGER NOT NULL CHECK (decoded >= 0),
    skipped     INTEGER NOT NULL CHECK (skipped >= 0 AND skipped <= decoded),
    PRIMARY KEY (path, xet_hash, file_start)
);
