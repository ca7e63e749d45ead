-- The closed sets of `attempts.outcome` and `discards.reason` become CHECK
-- constraints (the cache candidates' kind, outcome and placement have had
-- theirs since 0004). Each list is the stored names of one enum of
-- `receipts/src/events.rs` (`AttemptOutcome`, `DiscardReason`); a unit test
-- there holds each enum to the list below, so a new name needs a new
-- migration. `stale_part` was written by early versions only; it stays
-- accepted so their databases still migrate.
--
-- SQLite cannot add a CHECK to an existing column: each table is rebuilt
-- under a new name with the same columns, defaults and foreign keys, its
-- rows copied with their ids, the old table dropped and the new one renamed
-- (ids copied, so the AUTOINCREMENT counter goes on from the highest: both
-- tables are append-only). Neither table has indexes or
-- triggers, and no table refers to either. The migrator runs this in one
-- transaction: a crash leaves the old tables or the new ones, never both.

CREATE TABLE attempts_typed (
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
    outcome         TEXT    NOT NULL CHECK (outcome IN ('in_flight', 'ok', 'retry', 'failed', 'cancelled')),
    error           TEXT,
    tail_measured   INTEGER NOT NULL DEFAULT 0
);

INSERT INTO attempts_typed (id, run_id, path, started_at, finished_at, host, range_start,
                            if_range, status, content_range, etag, body_bytes, outcome, error,
                            tail_measured)
SELECT id, run_id, path, started_at, finished_at, host, range_start, if_range, status,
       content_range, etag, body_bytes, outcome, error, tail_measured
FROM attempts ORDER BY id;

DROP TABLE attempts;
ALTER TABLE attempts_typed RENAME TO attempts;

CREATE TABLE discards_typed (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id  INTEGER NOT NULL REFERENCES runs(id),
    path    TEXT    NOT NULL,
    reason  TEXT    NOT NULL CHECK (reason IN ('digest_mismatch', 'long_body_excess', 'part_shorter_than_watermark', 'published_file_missing', 'range_body_excess', 'range_not_honoured', 'ranges_do_not_tile_the_file', 'segment_alignment', 'stale_part', 'superseded_by_adopted_file', 'superseded_by_hf_cache', 'superseded_by_repin', 'unaligned_remainder', 'uncheckpointed_tail', 'validator_changed')),
    bytes   INTEGER NOT NULL CHECK (bytes >= 0),
    at      TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);

INSERT INTO discards_typed (id, run_id, path, reason, bytes, at)
SELECT id, run_id, path, reason, bytes, at FROM discards ORDER BY id;

DROP TABLE discards;
ALTER TABLE discards_typed RENAME TO discards;
