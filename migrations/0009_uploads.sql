-- Publish: the uploads of an artifact's files to object storage, the parts
-- of its multipart uploads, every request made, and the publications.
--
-- A multipart upload's id is stored once the server has created it and
-- before any part is sent; a part's row is written only after the server
-- answered its PUT with an ETag (the server holds those bytes: the upload
-- ledger never claims a byte the server has not acknowledged). A resumed
-- publish sends only the parts without a row. `verified` is the upload
-- receipt: the object was completed and a HEAD showed its size and SHA-256
-- metadata. `abandoned`: the server no longer knew the upload id, or the
-- file changed while it was sent; its parts are not reused.

CREATE TABLE uploads (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id      INTEGER NOT NULL REFERENCES runs(id),
    dest        TEXT    NOT NULL,
    key         TEXT    NOT NULL,
    path        TEXT    NOT NULL,
    size        INTEGER NOT NULL CHECK (size >= 0),
    sha256      TEXT    NOT NULL,
    part_size   INTEGER NOT NULL CHECK (part_size >= 0),
    upload_id   TEXT,
    state       TEXT    NOT NULL CHECK (state IN ('uploading', 'verified', 'abandoned')),
    etag        TEXT,
    started_at  TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    finished_at TEXT,
    CHECK (state <> 'uploading' OR (upload_id IS NOT NULL AND finished_at IS NULL))
);

-- At most one upload in progress per object.
CREATE UNIQUE INDEX uploads_in_progress ON uploads (dest, key) WHERE state = 'uploading';

CREATE TABLE upload_parts (
    upload      INTEGER NOT NULL REFERENCES uploads(id),
    part_number INTEGER NOT NULL CHECK (part_number BETWEEN 1 AND 10000),
    etag        TEXT    NOT NULL,
    size        INTEGER NOT NULL CHECK (size >= 0),
    run_id      INTEGER NOT NULL REFERENCES runs(id),
    at          TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    PRIMARY KEY (upload, part_number)
);

CREATE TABLE upload_attempts (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id      INTEGER NOT NULL REFERENCES runs(id),
    key         TEXT    NOT NULL,
    op          TEXT    NOT NULL CHECK (op IN ('put', 'create_multipart', 'upload_part', 'complete', 'head', 'manifest_put')),
    part_number INTEGER,
    host        TEXT    NOT NULL,
    bytes       INTEGER NOT NULL DEFAULT 0 CHECK (bytes >= 0),
    outcome     TEXT    NOT NULL CHECK (outcome IN ('in_flight', 'ok', 'failed')),
    error       TEXT,
    started_at  TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    finished_at TEXT
);

CREATE TABLE publications (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id          INTEGER NOT NULL REFERENCES runs(id),
    dest            TEXT    NOT NULL,
    fingerprint     TEXT    NOT NULL,
    manifest_sha256 TEXT    NOT NULL,
    outcome         TEXT    NOT NULL CHECK (outcome IN ('published', 'already_published')),
    at              TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
