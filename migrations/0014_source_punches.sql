-- Issue 35: a budgeted run keeps only the PLE spans of a converted PLE
-- file. Before punching holes over the rest of a source file, the run logs
-- the punch: which version of the file (its receipt's digest and size),
-- the ranges it keeps (header and PLE spans widened to whole allocation
-- units) and the SHA-256 of each, read from the verified file before the
-- first hole. A kill after the row finishes the punch on resume (punching
-- again is a no-op) and checks the kept ranges by digest before any is
-- read; the audit explains the punched bytes by this row.
--
-- A punch describes the file on disk until the file is retired or
-- re-acquired: the retirement log's writer sets `ended` in the same
-- transaction as its row. Rows are never deleted.

CREATE TABLE source_punches (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id     INTEGER NOT NULL REFERENCES runs(id),
    path       TEXT    NOT NULL,
    digest     TEXT    NOT NULL,
    size       INTEGER NOT NULL CHECK (size >= 0),
    kept_bytes INTEGER NOT NULL CHECK (kept_bytes >= 0 AND kept_bytes <= size),
    ended      INTEGER NOT NULL DEFAULT 0 CHECK (ended IN (0, 1)),
    at         TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);

CREATE INDEX source_punches_path ON source_punches (path);

CREATE TABLE source_kept_ranges (
    punch_id INTEGER NOT NULL REFERENCES source_punches(id),
    offset   INTEGER NOT NULL CHECK (offset >= 0),
    len      INTEGER NOT NULL CHECK (len > 0),
    sha256   TEXT    NOT NULL CHECK (length(sha256) = 64),
    PRIMARY KEY (punch_id, offset)
);
