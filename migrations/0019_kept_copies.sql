-- Issue 35: on a volume that cannot punch holes, a budgeted run (or one
-- with --retire-sources) copies the PLE spans of a converted PLE file
-- aside (DIR/.ftpipe/kept/<path>: the kept ranges back to back, in offset
-- order, written to a temp file, synced, renamed, the directory synced)
-- and only then logs the row that claims the copy; the source file is
-- unlinked after the row. A punch row says how its kept ranges are held:
--
--   punch       holes punched over the rest of the file, which keeps its
--               length; the kept ranges stay at their offsets (0014).
--   copy_aside  the kept ranges are in the copy, back to back; the source
--               file is released whole. kept_bytes is the copy's length.
--
-- Rows written before this migration are punches.

ALTER TABLE source_punches ADD COLUMN method TEXT NOT NULL DEFAULT 'punch'
    CHECK (method IN ('punch', 'copy_aside'));
