//! Named crash points, for tests that must stop the process at one exact
//! step (a seeded SIGKILL lands anywhere, so it cannot aim at a window of a
//! few microseconds). With `FTPIPE_CRASH_AT=NAME` in the environment the
//! process aborts — no destructors, no flush, like a kill — when it reaches
//! point `NAME`. Unset, a point costs one cached lookup.

use std::sync::OnceLock;

/// The environment variable naming the point to crash at.
pub const CRASH_AT_ENV: &str = "FTPIPE_CRASH_AT";

/// Aborts the process if `FTPIPE_CRASH_AT` names this point.
pub fn hit(name: &str) {
    static AT: OnceLock<Option<String>> = OnceLock::new();
    if AT
        .get_or_init(|| std::env::var(CRASH_AT_ENV).ok())
        .as_deref()
        == Some(name)
    {
        eprintln!("{CRASH_AT_ENV}={name}: aborting here");
        std::process::abort();
    }
}
