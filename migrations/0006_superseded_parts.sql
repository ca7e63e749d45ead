-- What a repin left of a file whose identity changed while its `.part`
-- held bytes of the old pin: its ranges, or, fetched as one stream, its
-- watermark as one range [0, size). The durable bytes were recorded by the
-- repin (`superseded_by_repin`); these rows let the next open measure the
-- tails the old pin's in-flight attempts wrote past them (counted, then
-- recorded the same way) instead of taking the old sparse `.part` for one
-- stream. Removed once that `.part` is emptied.
CREATE TABLE superseded_parts (
    path       TEXT    NOT NULL,
    start      INTEGER NOT NULL CHECK (start >= 0),
    end_       INTEGER NOT NULL,
    watermark  INTEGER NOT NULL,
    PRIMARY KEY (path, start),
    CHECK (start <= watermark AND watermark <= end_ AND start < end_)
);
