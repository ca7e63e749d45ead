//! Named crash points, for tests that must stop the process at one exact
//! step (a seeded SIGKILL lands anywhere, so it cannot aim at a window of a
//! few microseconds). With `FTPIPE_CRASH_AT=NAME` in the environment the
//! process aborts — no destructors, no flush, like a kill — when it first
//! reaches point `NAME`; with `FTPIPE_CRASH_AT=NAME#N`, the N-th time
//! (e.g. the publish of the last of N files fetched one at a time). Unset, a
//! point costs one cached lookup.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// The environment variable naming the point to crash at.
pub const CRASH_AT_ENV: &str = "FTPIPE_CRASH_AT";

/// The point to crash at and on which arrival (1-based).
struct Target {
    name: String,
    nth: u64,
    seen: AtomicU64,
}

fn target() -> Option<&'static Target> {
    static AT: OnceLock<Option<Target>> = OnceLock::new();
    AT.get_or_init(|| {
        let spec = std::env::var(CRASH_AT_ENV).ok()?;
        let (name, nth) = match spec.split_once('#') {
            Some((name, n)) => (name.to_owned(), n.parse().ok().filter(|n| *n > 0)?),
            None => (spec, 1),
        };
        Some(Target {
            name,
            nth,
            seen: AtomicU64::new(0),
        })
    })
    .as_ref()
}

/// Aborts the process if `FTPIPE_CRASH_AT` names this point (and arrival).
pub fn hit(name: &str) {
    let Some(t) = target() else { return };
    if t.name == name && t.seen.fetch_add(1, Ordering::SeqCst) + 1 == t.nth {
        eprintln!("{CRASH_AT_ENV}={name}#{}: aborting here", t.nth);
        std::process::abort();
    }
}
