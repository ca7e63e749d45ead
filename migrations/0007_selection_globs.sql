-- The include/exclude globs that chose `files.selected`, stored with the
-- listing they were applied to (same transaction as the pin), so a later
-- command can say which glob left a file out of the fetch. A database
-- from before this migration has no rows: its unselected files are known
-- only as unselected.
CREATE TABLE selection_globs (
    kind      TEXT    NOT NULL CHECK (kind IN ('include', 'exclude')),
    position  INTEGER NOT NULL CHECK (position >= 0),
    glob      TEXT    NOT NULL,
    PRIMARY KEY (kind, position)
);
