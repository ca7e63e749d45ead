-- Ranges of a file fetched in segments (several HTTP ranges into one
-- sparse `.part`). Range [start, end) holds durable bytes
-- [start, watermark); the file's ledger `committed_bytes` is
-- Σ (watermark − start) over its ranges, written in the same transaction.
-- Ranges tile [0, size) exactly. A file without rows is fetched as one
-- stream, its watermark being `committed_bytes` itself.
CREATE TABLE fetch_ranges (
    path       TEXT    NOT NULL REFERENCES files(path),
    start      INTEGER NOT NULL CHECK (start >= 0),
    end_       INTEGER NOT NULL,
    watermark  INTEGER NOT NULL,
    PRIMARY KEY (path, start),
    CHECK (start <= watermark AND watermark <= end_ AND start < end_)
);

-- An attempt cut short by a crash whose tail (bytes written past its
-- range's watermark) was measured and recorded: never counted again.
ALTER TABLE attempts ADD COLUMN tail_measured INTEGER NOT NULL DEFAULT 0;

-- Whatever resets a file's ledger (a discard back to fewer bytes, a
-- revoked receipt, a repin, a new size) or publishes it (a receipt) ends its ranges:
-- a range never outlives the bytes it describes.
CREATE TRIGGER fetch_ranges_end_on_rewind
AFTER UPDATE OF committed_bytes ON ledger
WHEN NEW.committed_bytes < OLD.committed_bytes
BEGIN
    DELETE FROM fetch_ranges WHERE path = NEW.path;
END;

CREATE TRIGGER fetch_ranges_end_on_resize
AFTER UPDATE OF expected_bytes ON ledger
WHEN NEW.expected_bytes != OLD.expected_bytes
BEGIN
    DELETE FROM fetch_ranges WHERE path = NEW.path;
END;

CREATE TRIGGER fetch_ranges_end_on_ledger_delete
AFTER DELETE ON ledger
BEGIN
    DELETE FROM fetch_ranges WHERE path = OLD.path;
END;

CREATE TRIGGER fetch_ranges_end_on_receipt
AFTER INSERT ON receipts
BEGIN
    DELETE FROM fetch_ranges WHERE path = NEW.path;
END;

CREATE TRIGGER fetch_ranges_end_on_receipt_update
AFTER UPDATE ON receipts
BEGIN
    DELETE FROM fetch_ranges WHERE path = NEW.path;
END;
