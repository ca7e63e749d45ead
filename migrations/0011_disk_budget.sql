-- Issue 28: what a `run --disk-budget` held. One row per run that fetched
-- under a budget: the budget and the peak of source bytes it held by the
-- admission's count (resident files + every admitted shard not yet
-- retired, a `.part` at its full size from its first byte), which bounds
-- the bytes on disk from above. The audit shows the last row.

CREATE TABLE disk_budget (
    run_id    INTEGER PRIMARY KEY REFERENCES runs(id),
    budget    INTEGER NOT NULL CHECK (budget >= 0),
    peak_held INTEGER NOT NULL CHECK (peak_held >= 0),
    at        TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
