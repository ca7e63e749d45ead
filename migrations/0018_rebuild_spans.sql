-- Issue 37, item 4: incremental rebuild after a repin. Before a repin's
-- fetch replaces a changed source file, `run` records, for each component
-- whose receipt was made from the old file with the same content (spans,
-- layout, converter and config) as the new plan gives it, the SHA-256 of
-- the old bytes of its spans in the files the repin changed
-- (`convert/src/rebuild.rs`). Once the new files are published, a
-- component whose new span bytes hash the same, and whose file still
-- hashes to its receipt, gets a receipt under its new identity and is kept
-- instead of rebuilt.
--
--   component       the component's path in the artifact.
--   from_identity   the identity of the receipt the row was recorded for.
--   to_identity     the component's identity under the new pin.
--   changed_files   JSON array of the changed source files its spans read.
--   spans_sha256    SHA-256 of those spans' old bytes (framed by file,
--                   offset and length, in the component's span order).
--
-- Rows are only ever added: a row is used only while the component's
-- receipt still has `from_identity` and the plan gives it `to_identity`.

CREATE TABLE rebuild_spans (
    component     TEXT    NOT NULL,
    from_identity TEXT    NOT NULL CHECK (length(from_identity) = 64),
    to_identity   TEXT    NOT NULL CHECK (length(to_identity) = 64),
    changed_files TEXT    NOT NULL CHECK (json_valid(changed_files)),
    spans_sha256  TEXT    NOT NULL CHECK (length(spans_sha256) = 64),
    run_id        INTEGER NOT NULL REFERENCES runs(id),
    at            TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    PRIMARY KEY (component, from_identity, to_identity)
);
