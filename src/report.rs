//! Progress display: the only place that knows indicatif. Four flavours
//! behind the stages' `Reporter` trait: bars on a TTY, periodic log lines
//! (not a TTY), newline-delimited JSON (`--json`), and nothing (`--quiet`:
//! errors still reach stderr through the exit path).

use std::collections::HashMap;
use std::io::Write;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressStyle};

use ftpipe_stages::progress::{ProgressEvent, Reporter};

/// `--quiet`: no progress at all.
pub struct Silent;

impl Reporter for Silent {
    fn report(&self, _event: ProgressEvent) {}
}

/// Bars: one per active file and a total (bytes, rate, ETA).
pub struct Bars {
    multi: MultiProgress,
    total: ProgressBar,
    files: Mutex<HashMap<String, ProgressBar>>,
}

impl Bars {
    pub fn new() -> Bars {
        let multi = MultiProgress::new();
        let total = multi.add(ProgressBar::new(0));
        total.set_style(
            ProgressStyle::with_template(
                "{prefix:>8} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} ETA {eta}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        total.set_prefix("total");
        Bars {
            multi,
            total,
            files: Mutex::new(HashMap::new()),
        }
    }
}

impl Reporter for Bars {
    fn report(&self, event: ProgressEvent) {
        let mut files = self.files.lock().unwrap_or_else(|p| p.into_inner());
        match event {
            ProgressEvent::FetchPlanned {
                total_bytes,
                done_bytes,
                ..
            } => {
                self.total.set_length(total_bytes);
                self.total.set_position(done_bytes);
            }
            ProgressEvent::FileStarted {
                path,
                size,
                resumed_from,
            } => {
                let bar = files.entry(path.clone()).or_insert_with(|| {
                    let b = self
                        .multi
                        .insert_before(&self.total, ProgressBar::new(size));
                    b.set_style(
                        ProgressStyle::with_template(
                            "  {msg:40!} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec}",
                        )
                        .unwrap_or_else(|_| ProgressStyle::default_bar())
                        .progress_chars("=> "),
                    );
                    b.set_message(path);
                    b
                });
                bar.set_position(resumed_from);
            }
            ProgressEvent::FileBytes { path, bytes } => {
                if let Some(b) = files.get(&path) {
                    b.inc(bytes);
                }
                self.total.inc(bytes);
            }
            ProgressEvent::FileRewound { path, to, .. } => {
                if let Some(b) = files.get(&path) {
                    let back = b.position().saturating_sub(to);
                    b.set_position(to);
                    self.total
                        .set_position(self.total.position().saturating_sub(back));
                }
            }
            ProgressEvent::FilePublished { path, .. } => {
                if let Some(b) = files.remove(&path) {
                    b.finish_and_clear();
                    self.multi.remove(&b);
                }
            }
            ProgressEvent::FileFailed { path, error } => {
                if let Some(b) = files.remove(&path) {
                    b.abandon();
                }
                let _ = self.multi.println(format!("failed: {path}: {error}"));
            }
            ProgressEvent::FileRetry {
                path,
                attempt,
                delay,
                retry_after_secs,
                error,
            } => {
                let _ = self.multi.println(format!(
                    "retry {attempt} of {path} in {delay:.1?}{}: {error}",
                    waiting_note(retry_after_secs)
                ));
            }
            ProgressEvent::ConvertPlanned {
                total_bytes,
                done_bytes,
                ..
            } => {
                self.total.set_prefix("convert");
                self.total.set_length(total_bytes);
                self.total.set_position(done_bytes);
            }
            ProgressEvent::ComponentWritten { size, .. } => self.total.inc(size),
            ProgressEvent::Note { message } => {
                let _ = self.multi.println(message);
            }
        }
    }
}

impl Drop for Bars {
    fn drop(&mut self) {
        self.total.finish_and_clear();
    }
}

/// Periodic log lines on stderr.
pub struct LogLines {
    state: Mutex<LogState>,
}

struct LogState {
    total: u64,
    done: u64,
    last: Instant,
}

impl LogLines {
    pub fn new() -> LogLines {
        LogLines {
            state: Mutex::new(LogState {
                total: 0,
                done: 0,
                last: Instant::now(),
            }),
        }
    }
}

impl Reporter for LogLines {
    fn report(&self, event: ProgressEvent) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let line = match event {
            ProgressEvent::FetchPlanned {
                files,
                total_bytes,
                done_bytes,
            } => {
                s.total = total_bytes;
                s.done = done_bytes;
                Some(format!(
                    "fetch: {files} files, {total_bytes} bytes, {done_bytes} already durable"
                ))
            }
            ProgressEvent::FileBytes { bytes, .. } => {
                s.done += bytes;
                if s.last.elapsed() >= Duration::from_secs(5) {
                    s.last = Instant::now();
                    Some(format!("progress: {}/{} bytes", s.done, s.total))
                } else {
                    None
                }
            }
            ProgressEvent::FileRewound { path, to, reason } => {
                Some(format!("{path}: rewound to {to} ({reason})"))
            }
            ProgressEvent::FileRetry {
                path,
                attempt,
                delay,
                retry_after_secs,
                error,
            } => Some(format!(
                "{path}: retry {attempt} in {delay:.1?}{}: {error}",
                waiting_note(retry_after_secs)
            )),
            ProgressEvent::FilePublished { path, size } => {
                Some(format!("{path}: verified and published ({size} bytes)"))
            }
            ProgressEvent::FileFailed { path, error } => Some(format!("{path}: failed: {error}")),
            ProgressEvent::Note { message } => Some(message),
            ProgressEvent::ConvertPlanned {
                components,
                total_bytes,
                done_bytes,
            } => {
                s.total = total_bytes;
                s.done = done_bytes;
                Some(format!(
                    "convert: {components} components, {total_bytes} bytes, {done_bytes} already durable"
                ))
            }
            ProgressEvent::ComponentWritten { path, kind, size } => {
                s.done += size;
                Some(format!(
                    "{path}: {kind} written and durable ({size} bytes; {}/{})",
                    s.done, s.total
                ))
            }
            ProgressEvent::FileStarted {
                path, resumed_from, ..
            } if resumed_from > 0 => Some(format!("{path}: resuming at byte {resumed_from}")),
            ProgressEvent::FileStarted { .. } => None,
        };
        if let Some(line) = line {
            eprintln!("{line}");
        }
    }
}

/// Newline-delimited JSON events on stdout.
pub struct JsonLines;

impl Reporter for JsonLines {
    fn report(&self, event: ProgressEvent) {
        if let Ok(line) = serde_json::to_string(&event) {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{line}");
        }
    }
}

/// What a retry waits for when the hub set `Retry-After`.
fn waiting_note(retry_after_secs: Option<u64>) -> String {
    match retry_after_secs {
        Some(secs) => format!(
            " (waiting for the hub: Retry-After {secs} s, capped at {} s)",
            ftpipe_stages::limits::MAX_RETRY_AFTER.as_secs()
        ),
        None => String::new(),
    }
}
