-- Issue 37, item 3: a new revision's term whose chunks an earlier fetch
-- recorded is copied from the old file's bytes (each chunk read back and
-- checked against its recorded Xet hash) instead of fetched from the CAS.
--
-- The chunks of a term are looked up by xorb as the new reconstruction's
-- terms come (never every row at once): the index below serves
-- `WHERE xorb = ?`.
--
-- `reused` adds up the decoded bytes of the term that came from old files,
-- not the CAS (a term is reused whole or fetched whole, so per fetch it is
-- 0 or `decoded`); `fetched` stays the compressed bytes the CAS sent.
-- Rows written before this migration were all fetched: 0.

ALTER TABLE xet_terms ADD COLUMN reused INTEGER NOT NULL DEFAULT 0
    CHECK (reused >= 0 AND reused <= decoded);

CREATE INDEX xet_terms_by_xorb ON xet_terms (xorb, chunk_start);
