-- Conversion state. `components` holds one receipt per output component,
-- written only after the component file and its directory entry are
-- fsynced; `identity` is the SHA-256 of everything that determines its
-- bytes (converter variant, layout, source file digests), so a receipt is
-- reused only under the identity it was made with.

CREATE TABLE components (
    path            TEXT    PRIMARY KEY,
    kind            TEXT    NOT NULL,
    predicted_bytes INTEGER NOT NULL CHECK (predicted_bytes >= 0),
    size            INTEGER NOT NULL CHECK (size >= 0),
    sha256          TEXT    NOT NULL CHECK (length(sha256) = 64),
    identity        TEXT    NOT NULL CHECK (length(identity) = 64),
    run_id          INTEGER NOT NULL REFERENCES runs(id),
    completed_at    TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    CHECK (size = predicted_bytes)
);

-- Append-only: a source file retired (deleted after every component that
-- reads it had a receipt) or re-acquired. The last row per path wins.
CREATE TABLE source_retirements (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id  INTEGER NOT NULL REFERENCES runs(id),
    path    TEXT    NOT NULL,
    event   TEXT    NOT NULL CHECK (event IN ('retired', 'reacquired')),
    bytes   INTEGER NOT NULL CHECK (bytes >= 0),
    at      TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);

-- Append-only: every manifest written (after it is fsynced), and every
-- artifact set aside by --rebuild.
CREATE TABLE artifacts (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id          INTEGER NOT NULL REFERENCES runs(id),
    event           TEXT    NOT NULL CHECK (event IN ('manifest', 'set_aside')),
    manifest_sha256 TEXT,
    fingerprint     TEXT,
    detail          TEXT    NOT NULL DEFAULT '',
    at              TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
