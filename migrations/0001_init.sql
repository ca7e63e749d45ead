-- ftpipe durable state. Every table is append-only except `pin`, `files`
-- (replaced as one unit by a repin), `ledger` (monotone counters plus the
-- watermark) and `receipts` (one row per published file).

CREATE TABLE runs (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    started_at      TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    command         TEXT    NOT NULL,
    pid             INTEGER NOT NULL,
    ftpipe_version  TEXT    NOT NULL
);

-- Append-only; stage status is derived by replaying these rows.
CREATE TABLE stage_events (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id  INTEGER NOT NULL REFERENCES runs(id),
    stage   TEXT    NOT NULL,
    event   TEXT    NOT NULL,
    detail  TEXT    NOT NULL DEFAULT '',
    at      TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);

-- The pinned revision: exactly one row once resolve has run.
CREATE TABLE pin (
    id          INTEGER PRIMARY KEY CHECK (id = 1),
    repo        TEXT NOT NULL,
    revision    TEXT NOT NULL,
    commit_sha  TEXT NOT NULL CHECK (length(commit_sha) = 40),
    endpoint    TEXT NOT NULL,
    pinned_at   TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);

-- The listing at the pinned commit. Identities are kept in separate columns
-- and never compared with one another.
CREATE TABLE files (
    path        TEXT    PRIMARY KEY,
    size        INTEGER NOT NULL CHECK (size >= 0),
    git_oid     TEXT    NOT NULL,
    lfs_sha256  TEXT,
    xet_hash    TEXT,
    selected    INTEGER NOT NULL CHECK (selected IN (0, 1))
);

-- Byte ledger, one row per selected file.
--   committed: durable watermark of body bytes appended by us (fsynced first)
--   transferred: every body byte received, including later discarded ones
--   adopted: bytes of a final file found on disk and adopted after re-hashing
-- Invariants: transferred = committed + sum(discards.bytes);
--             at publish, expected = committed + adopted.
CREATE TABLE ledger (
    path              TEXT    PRIMARY KEY REFERENCES files(path),
    expected_bytes    INTEGER NOT NULL CHECK (expected_bytes >= 0),
    committed_bytes   INTEGER NOT NULL DEFAULT 0 CHECK (committed_bytes >= 0),
    transferred_bytes INTEGER NOT NULL DEFAULT 0 CHECK (transferred_bytes >= 0),
    adopted_bytes     INTEGER NOT NULL DEFAULT 0 CHECK (adopted_bytes >= 0),
    validator         TEXT,
    CHECK (committed_bytes + adopted_bytes <= expected_bytes)
);

CREATE TABLE discards (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id  INTEGER NOT NULL REFERENCES runs(id),
    path    TEXT    NOT NULL,
    reason  TEXT    NOT NULL,
    bytes   INTEGER NOT NULL CHECK (bytes >= 0),
    at      TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);

-- Every HTTP attempt for a file body, kept whatever its outcome.
CREATE TABLE attempts (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id          INTEGER NOT NULL REFERENCES runs(id),
    path            TEXT    NOT NULL,
    started_at      TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    finished_at     TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    host            TEXT    NOT NULL,
    range_start     INTEGER,
    if_range        TEXT,
    status          INTEGER,
    content_range   TEXT,
    etag            TEXT,
    body_bytes      INTEGER NOT NULL DEFAULT 0,
    outcome         TEXT    NOT NULL,
    error           TEXT
);

-- One row per published file; written only after the file and its
-- directory entry are fsynced.
CREATE TABLE receipts (
    path          TEXT    PRIMARY KEY REFERENCES files(path),
    size          INTEGER NOT NULL,
    digest_kind   TEXT    NOT NULL CHECK (digest_kind IN ('sha256', 'git-sha1')),
    digest        TEXT    NOT NULL,
    completed_at  TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    run_id        INTEGER NOT NULL REFERENCES runs(id),
    adopted       INTEGER NOT NULL DEFAULT 0
);
