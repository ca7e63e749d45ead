-- A registry blob can arrive in a repository without a byte sent: a
-- cross-repository mount (`POST /v2/NAME/blobs/uploads/?mount=DIGEST&from=
-- REPO`, answered `201`) links the blob another repository of the same
-- registry holds. Its `uploads` row is the receipt like any other
-- (`verified`, `found` = `nothing`: the head before it found no blob in the
-- repository) and says where the blob came from:
--
--   mounted_from  the repository the registry mounted the blob from; NULL
--                 when the bytes were sent (or reused in place), and on
--                 every row written before this migration.
--
-- A column added without a default keeps every row as it is.

ALTER TABLE uploads ADD COLUMN mounted_from TEXT;
