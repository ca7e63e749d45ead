//! An upload's stall check under `--read-timeout`, for every client that
//! sends a body (registry `PATCH`/`PUT`, S3 `PUT` and part uploads).
//!
//! `reqwest`'s `read_timeout` runs while a request's body is still being
//! sent (the connection is read for an early answer), so a body that takes
//! longer than the read timeout over a slow uplink was cut although it
//! moved. Uploads therefore go through clients without it, and their stall
//! check is the body's progress ([`Progress`], [`watched`]): no body bytes
//! taken by the connection for the read timeout ends the request. The
//! connection takes bytes into socket buffers before the network carries
//! them, so once it has taken the whole body the answer is awaited for the
//! read timeout plus the time the unseen tail (at most [`UNSEEN_TAIL_MAX`])
//! takes at [`UPLOAD_FLOOR_RATE`].

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;

/// Bytes of an upload's body handed to the connection at a time: the
/// unit of its progress.
const UPLOAD_STEP: usize = 16 * 1024;

/// Most body bytes assumed to sit in socket buffers (the client's send
/// buffer and the peer's receive window, a few MiB each on Linux) once
/// the connection has taken the whole body.
const UNSEEN_TAIL_MAX: u64 = 8 * 1024 * 1024;
/// The slowest uplink an upload's unseen tail is waited for at (bytes a
/// second).
const UPLOAD_FLOOR_RATE: u64 = 64 * 1024;

/// How far an upload's body has gone: the bytes the connection took and
/// when it last took some.
#[derive(Debug)]
pub(crate) struct Progress {
    sent: std::sync::atomic::AtomicU64,
    last: Mutex<tokio::time::Instant>,
}

impl Progress {
    pub(crate) fn new() -> Arc<Progress> {
        Arc::new(Progress {
            sent: std::sync::atomic::AtomicU64::new(0),
            last: Mutex::new(tokio::time::Instant::now()),
        })
    }

    fn touch(&self, n: usize) {
        self.sent
            .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
        *self
            .last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = tokio::time::Instant::now();
    }

    fn last(&self) -> tokio::time::Instant {
        *self
            .last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// `bytes` as a body handed on [`UPLOAD_STEP`] bytes at a time, each
    /// step counted when the connection takes it.
    pub(crate) fn body(self: &Arc<Progress>, bytes: &Bytes) -> reqwest::Body {
        let progress = self.clone();
        let steps: Vec<Bytes> = (0..bytes.len())
            .step_by(UPLOAD_STEP)
            .map(|at| bytes.slice(at..bytes.len().min(at.saturating_add(UPLOAD_STEP))))
            .collect();
        let stream = futures_util::stream::iter(steps).map(move |step| {
            progress.touch(step.len());
            Ok::<Bytes, std::convert::Infallible>(step)
        });
        reqwest::Body::wrap_stream(stream)
    }
}

/// An upload whose body stalled: the body bytes the connection took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stalled {
    pub(crate) sent: u64,
}

/// `request` (an upload sending a body of `len` bytes through `progress`),
/// or [`Stalled`] once the connection took no body byte for `read_timeout`,
/// or, having taken it all, no answer came within `read_timeout` and the
/// unseen tail's time.
pub(crate) async fn watched<T>(
    read_timeout: Duration,
    len: u64,
    progress: &Progress,
    request: impl std::future::Future<Output = T>,
) -> std::result::Result<T, Stalled> {
    tokio::pin!(request);
    let tail = Duration::from_secs(len.min(UNSEEN_TAIL_MAX) / UPLOAD_FLOOR_RATE);
    let sent = || progress.sent.load(std::sync::atomic::Ordering::Relaxed);
    let deadline = || {
        let taken = sent() >= len;
        progress.last() + read_timeout + if taken { tail } else { Duration::ZERO }
    };
    loop {
        tokio::select! {
            done = &mut request => return Ok(done),
            () = tokio::time::sleep_until(deadline()) => {
                if deadline() <= tokio::time::Instant::now() {
                    return Err(Stalled { sent: sent() });
                }
            }
        }
    }
}
