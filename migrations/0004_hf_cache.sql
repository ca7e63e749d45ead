-- Bytes taken from a Hugging Face hub cache instead of the network: a whole
-- verified blob (the watermark then jumps to expected) or the prefix of an
-- interrupted `hf download` copied into `.part` (part of the watermark).
-- Invariant with it: transferred + cache = committed + sum(discards.bytes).
ALTER TABLE ledger ADD COLUMN cache_bytes INTEGER NOT NULL DEFAULT 0 CHECK (cache_bytes >= 0);

-- Append-only: every cache file looked at for a pinned file and what became
-- of it. `kind`: blob (LFS sha256), snapshot (small file at the pinned
-- commit), incomplete (an interrupted download's prefix). `outcome`:
-- adopted (whole file, verified), resumed (prefix copied into `.part`),
-- rejected (wrong size, digest mismatch, unsafe link; not used).
CREATE TABLE cache_candidates (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id      INTEGER NOT NULL REFERENCES runs(id),
    path        TEXT    NOT NULL,
    cache_path  TEXT    NOT NULL,
    kind        TEXT    NOT NULL CHECK (kind IN ('blob', 'snapshot', 'incomplete')),
    outcome     TEXT    NOT NULL CHECK (outcome IN ('adopted', 'resumed', 'rejected')),
    placement   TEXT    CHECK (placement IS NULL OR placement IN ('reflink', 'hardlink', 'copy')),
    bytes       INTEGER NOT NULL CHECK (bytes >= 0),
    detail      TEXT    NOT NULL DEFAULT '',
    at          TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
