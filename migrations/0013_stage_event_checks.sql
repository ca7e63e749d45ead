-- The closed sets of `stage_events.stage` and `stage_events.event` become
-- CHECK constraints. Each list is the stored names of one enum of
-- `receipts/src/events.rs` (`Stage`, `StageEvent`); a unit test there holds
-- each enum to the list below, so a new name needs a new migration. These
-- five stages and three events are the only names any version has written.
--
-- The table is rebuilt the way 0008 rebuilt `attempts` and `discards`
-- (SQLite cannot add a CHECK to an existing column): same columns, defaults
-- and foreign key, rows copied with their ids (the AUTOINCREMENT counter
-- goes on from the highest; the table is append-only), the old table
-- dropped and the new one renamed. It has no indexes or triggers and no
-- table refers to it. The migrator runs this in one transaction: a crash
-- leaves the old table or the new one, never both. This migration touches
-- no other table, so it does not depend on 0012.

CREATE TABLE stage_events_typed (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id  INTEGER NOT NULL REFERENCES runs(id),
    stage   TEXT    NOT NULL CHECK (stage IN ('resolve', 'plan', 'fetch', 'convert', 'verify')),
    event   TEXT    NOT NULL CHECK (event IN ('started', 'completed', 'failed')),
    detail  TEXT    NOT NULL DEFAULT '',
    at      TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);

INSERT INTO stage_events_typed (id, run_id, stage, event, detail, at)
SELECT id, run_id, stage, event, detail, at FROM stage_events ORDER BY id;

DROP TABLE stage_events;
ALTER TABLE stage_events_typed RENAME TO stage_events;
