-- The upload records become target-neutral: what publish and mirror record
-- names an output target's concepts (a session with acknowledged parts, a
-- version tag), not S3's (an upload id, part ETags, at most 10,000 parts),
-- so a second kind of target (a registry's chunked blob uploads) writes the
-- same rows. Nothing is lost: every column keeps its meaning and its rows.
--
-- uploads:          upload_id -> session (the target's handle of an upload in
--                   progress: S3's upload id, a registry's upload location);
--                   etag -> version (the object's version tag as the target
--                   answered it). Renamed in place: the CHECKs and the partial
--                   unique index follow the columns, and upload_parts' foreign
--                   key still names uploads(id).
-- upload_parts:     etag -> receipt (the target's acknowledgement of the part,
--                   what completing the session needs); part_number >= 1,
--                   the most parts being the target's limit, not the table's.
-- upload_attempts:  op takes the target-neutral names of `UploadOp`
--                   (receipts/src/events.rs): create_multipart -> begin_upload,
--                   upload_part -> send_part, complete -> complete_upload,
--                   manifest_put -> put_commit; head and put keep theirs. A
--                   part number is 1 or more, and only on send_part.
--
-- The two rebuilt tables follow 0008's recipe: a new table with the new
-- CHECKs, every row copied with its id, the old one dropped and the new one
-- renamed. No table refers to either. The migrator runs this in one
-- transaction: a crash leaves the old tables or the new ones, never both.

ALTER TABLE uploads RENAME COLUMN upload_id TO session;
ALTER TABLE uploads RENAME COLUMN etag TO version;

CREATE TABLE upload_parts_neutral (
    upload      INTEGER NOT NULL REFERENCES uploads(id),
    part_number INTEGER NOT NULL CHECK (part_number >= 1),
    receipt     TEXT    NOT NULL,
    size        INTEGER NOT NULL CHECK (size >= 0),
    run_id      INTEGER NOT NULL REFERENCES runs(id),
    at          TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    PRIMARY KEY (upload, part_number)
);

INSERT INTO upload_parts_neutral (upload, part_number, receipt, size, run_id, at)
SELECT upload, part_number, etag, size, run_id, at FROM upload_parts ORDER BY upload, part_number;

DROP TABLE upload_parts;
ALTER TABLE upload_parts_neutral RENAME TO upload_parts;

CREATE TABLE upload_attempts_neutral (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id      INTEGER NOT NULL REFERENCES runs(id),
    key         TEXT    NOT NULL,
    op          TEXT    NOT NULL CHECK (op IN ('head', 'put', 'begin_upload', 'send_part', 'complete_upload', 'put_commit')),
    part_number INTEGER CHECK (part_number IS NULL OR (op = 'send_part' AND part_number >= 1)),
    host        TEXT    NOT NULL,
    bytes       INTEGER NOT NULL DEFAULT 0 CHECK (bytes >= 0),
    outcome     TEXT    NOT NULL CHECK (outcome IN ('in_flight', 'ok', 'failed')),
    error       TEXT,
    started_at  TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    finished_at TEXT
);

INSERT INTO upload_attempts_neutral (id, run_id, key, op, part_number, host, bytes, outcome,
                                     error, started_at, finished_at)
SELECT id, run_id, key,
       CASE op
           WHEN 'create_multipart' THEN 'begin_upload'
           WHEN 'upload_part' THEN 'send_part'
           WHEN 'complete' THEN 'complete_upload'
           WHEN 'manifest_put' THEN 'put_commit'
           ELSE op
       END,
       part_number, host, bytes, outcome, error, started_at, finished_at
FROM upload_attempts ORDER BY id;

DROP TABLE upload_attempts;
ALTER TABLE upload_attempts_neutral RENAME TO upload_attempts;
