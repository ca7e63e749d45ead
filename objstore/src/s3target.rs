//! S3 as an [`OutputTarget`]: each term of the seam is one request of
//! [`S3`]. A session is a multipart upload (its handle the upload id), a
//! part's receipt its ETag, a version tag the object's ETag, the checksum
//! metadata `x-amz-meta-ftpipe-sha256`, the store checksum S3's
//! additional checksum (SHA-256; a multipart object's is `COMPOSITE`, over
//! its parts), read back by [`S3::head_checked`]; parts go in any order,
//! several at once, within S3's limits ([`MIN_PART_SIZE`],
//! [`MAX_PART_NUMBER`]).

use bytes::Bytes;
use futures_util::FutureExt;

use crate::client::{Head, MAX_PART_NUMBER, MIN_PART_SIZE, ObjectBody, Put, S3};
use crate::target::{Listed, OutputTarget, PartRequest, PartRules, PutMode, TargetFuture};

impl OutputTarget for S3 {
    fn dest(&self) -> String {
        self.location().to_string()
    }

    fn key(&self, rel: &str) -> String {
        self.location().key(rel)
    }

    fn url_of(&self, key: &str) -> String {
        self.location().url_of(key)
    }

    fn host(&self) -> &str {
        S3::host(self)
    }

    fn part_rules(&self) -> PartRules {
        PartRules {
            min_part_size: MIN_PART_SIZE,
            max_parts: MAX_PART_NUMBER,
            in_order: false,
        }
    }

    fn head<'a>(&'a self, key: &'a str) -> TargetFuture<'a, Option<Head>> {
        S3::head_checked(self, key).boxed()
    }

    fn get_bounded<'a>(&'a self, key: &'a str, max: u64) -> TargetFuture<'a, Option<ObjectBody>> {
        S3::get_bounded(self, key, max).boxed()
    }

    fn list<'a>(&'a self, prefix: &'a str, max: usize) -> TargetFuture<'a, Vec<Listed>> {
        async move {
            let found = S3::list(self, prefix, max).await?;
            Ok(found
                .into_iter()
                .map(|(key, size)| Listed { key, size })
                .collect())
        }
        .boxed()
    }

    fn put<'a>(
        &'a self,
        key: &'a str,
        bytes: Bytes,
        sha256: &'a str,
        mode: PutMode,
    ) -> TargetFuture<'a, Put> {
        S3::put(self, key, bytes, sha256, mode == PutMode::CreateOnly).boxed()
    }

    fn begin_upload<'a>(&'a self, key: &'a str, sha256: &'a str) -> TargetFuture<'a, String> {
        self.create_multipart(key, sha256).boxed()
    }

    fn send_part<'a>(
        &'a self,
        key: &'a str,
        session: &'a str,
        part: PartRequest,
    ) -> TargetFuture<'a, String> {
        async move { S3::put_part(self, key, session, part.number, part.bytes, &part.sha256).await }
            .boxed()
    }

    fn complete_upload<'a>(
        &'a self,
        key: &'a str,
        session: &'a str,
        receipts: Vec<String>,
        _sha256: &'a str,
    ) -> TargetFuture<'a, Option<String>> {
        // The checksum metadata was set when the upload was created.
        self.complete_multipart(key, session, receipts).boxed()
    }

    fn abort_upload<'a>(&'a self, key: &'a str, session: &'a str) -> TargetFuture<'a, ()> {
        self.abort_multipart(key, session).boxed()
    }
}
