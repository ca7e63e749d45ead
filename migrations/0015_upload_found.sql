-- Publish reuses an object already at a key only when the store's own
-- checksum of its bytes (S3's additional checksum, computed by the store
-- from the bytes it received) proves they are the file's; the
-- `x-amz-meta-ftpipe-sha256` metadata is a claim anyone with write access
-- can make and no longer decides. Each upload row now says what the head
-- before it found at the key (`FoundObject` in receipts/src/events.rs):
--
--   nothing      no object there: uploaded.
--   proven       an object whose store checksum proves its bytes: reused,
--                nothing sent (the row is its receipt).
--   not_proven   an object whose store checksum did not prove its bytes
--                (other bytes, another size, another part count): uploaded
--                again over it.
--   no_checksum  an object without a store checksum (an older ftpipe's,
--                another tool's): not trusted, uploaded again over it.
--
-- NULL: the row was written before this migration (what was found then was
-- not recorded; an object was reused on its size and metadata). A column
-- added with a CHECK and no default keeps every row as it is.

ALTER TABLE uploads ADD COLUMN found TEXT
    CHECK (found IS NULL OR found IN ('nothing', 'proven', 'not_proven', 'no_checksum'));
