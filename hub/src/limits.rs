//! Named limits on everything a server or a listing can claim.

use std::time::Duration;

/// Largest JSON body accepted from the hub (revision info, one tree page).
pub const MAX_JSON_BYTES: u64 = 64 * 1024 * 1024;
/// Largest tree page accepted (the hub sends ~1000 entries, ~300 KB).
pub const MAX_TREE_PAGE_BYTES: u64 = 16 * 1024 * 1024;
/// Largest listing accepted, summed over its pages (~200k files); with
/// [`MAX_TREE_PAGE_BYTES`] it bounds what a listing holds in memory.
pub const MAX_LISTING_BYTES: u64 = 64 * 1024 * 1024;
/// Most tree pages followed before the listing is refused.
pub const MAX_TREE_PAGES: usize = 10_000;
/// Most files a listing may hold.
pub const MAX_FILES: usize = 1_000_000;
/// Largest single file accepted (64 TiB).
pub const MAX_FILE_SIZE: u64 = 64 << 40;
/// Redirect hops followed for one request.
pub const MAX_REDIRECTS: usize = 10;
/// Longest `Retry-After` honoured.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);
