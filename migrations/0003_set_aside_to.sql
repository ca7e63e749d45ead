-- Where a set-aside artifact goes (a directory name under DIR), recorded
-- before the rename so a run killed in between finishes that rename
-- instead of setting aside again under another name.
ALTER TABLE artifacts ADD COLUMN set_aside_to TEXT;
