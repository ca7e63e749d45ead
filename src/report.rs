//! Progress display: the only place that knows indicatif. Four flavours
//! behind the stages' `Reporter` trait: bars on a TTY, periodic log lines
//! (not a TTY), newline-delimited JSON (`--json`), and nothing (`--quiet`:
//! errors still reach stderr through the exit path).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressState, ProgressStyle};

use ftpipe_progress::{ProgressEvent, Reporter, human};

/// `--quiet`: no progress at all.
pub struct Silent;

impl Reporter for Silent {
    fn report(&self, _event: ProgressEvent) {}
}

/// Bars: a total (bytes done, network rate, ETA), one per file in flight,
/// and, once a conversion is planned, its own bar below (a pipelined `run`
/// fetches and converts at once: both show). Bytes already durable or
/// taken from the Hugging Face cache count as done but not towards the
/// rate; no bar goes past its length.
pub struct Bars {
    multi: MultiProgress,
    total: ProgressBar,
    convert: ProgressBar,
    state: Mutex<BarState>,
}

struct BarState {
    files: HashMap<String, ProgressBar>,
    /// Network bytes received by this process (the rate's numerator).
    network: u64,
    started: Instant,
    last_msg: Option<Instant>,
}

/// How often the total bar's rate text is recomputed.
const RATE_REFRESH: Duration = Duration::from_millis(200);

/// A bar style from `template`, whose `{size}` and `{total_size}` are
/// the bar's position and length in the one formatter of sizes.
fn bar_style(template: &str) -> ProgressStyle {
    ProgressStyle::with_template(template)
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .with_key("size", |s: &ProgressState, w: &mut dyn std::fmt::Write| {
            let _ = w.write_str(&human::bytes(s.pos()));
        })
        .with_key(
            "total_size",
            |s: &ProgressState, w: &mut dyn std::fmt::Write| {
                let _ = w.write_str(&human::bytes(s.len().unwrap_or(0)));
            },
        )
        .progress_chars("=> ")
}

/// Moves `bar` forward by `by`, never past its length.
fn advance(bar: &ProgressBar, by: u64) {
    let len = bar.length().unwrap_or(u64::MAX);
    bar.set_position(bar.position().saturating_add(by).min(len));
}

impl Bars {
    pub fn new() -> Bars {
        let multi = MultiProgress::new();
        let total = multi.add(ProgressBar::new(0));
        total.set_style(bar_style(
            "{prefix:>8} [{bar:40}] {percent:>3}% {size}/{total_size} {msg}",
        ));
        total.set_prefix("total");
        let convert = ProgressBar::hidden();
        convert.set_style(bar_style(
            "{prefix:>8} [{bar:40}] {percent:>3}% {size}/{total_size} {msg}",
        ));
        convert.set_prefix("convert");
        Bars {
            multi,
            total,
            convert,
            state: Mutex::new(BarState {
                files: HashMap::new(),
                network: 0,
                started: Instant::now(),
                last_msg: None,
            }),
        }
    }

    /// The rate and ETA text of the total bar: network bytes of this
    /// process over its elapsed time.
    fn refresh_rate(&self, s: &mut BarState, force: bool) {
        let now = Instant::now();
        if !force && s.last_msg.is_some_and(|t| now - t < RATE_REFRESH) {
            return;
        }
        s.last_msg = Some(now);
        let secs = (now - s.started).as_secs_f64().max(1e-3);
        let rate = s.network as f64 / secs;
        let left = self
            .total
            .length()
            .unwrap_or(0)
            .saturating_sub(self.total.position());
        let eta = if rate >= 1.0 {
            format!(
                "ETA {}",
                indicatif::HumanDuration(Duration::from_secs_f64(left as f64 / rate))
            )
        } else {
            "ETA -".to_owned()
        };
        #[expect(clippy::cast_sign_loss, reason = "a non-negative rate; `as` saturates")]
        let rate = rate as u64;
        self.total
            .set_message(format!("{}/s {eta}", human::bytes(rate)));
    }

    /// A bar for `path` above the total (once), at `resumed_from`.
    fn file_started(&self, s: &mut BarState, path: String, size: u64, resumed_from: u64) {
        let bar = s.files.entry(path.clone()).or_insert_with(|| {
            let b = self
                .multi
                .insert_before(&self.total, ProgressBar::new(size));
            b.set_style(bar_style(
                "  {msg:40!} [{bar:30}] {percent:>3}% {size}/{total_size}",
            ));
            b.set_message(path);
            b
        });
        bar.set_position(resumed_from.min(size));
    }

    /// Removes the bar of a file that is published or failed.
    fn file_done(&self, s: &mut BarState, path: &str) {
        if let Some(b) = s.files.remove(path) {
            b.finish_and_clear();
            self.multi.remove(&b);
        }
    }

    /// Prints `line` above the bars, redacted.
    fn println(&self, line: &str) {
        let _ = self.multi.println(crate::output::redacted(line));
    }

    /// An event that is a line above the bars: the cache's adoptions and
    /// rejections, retries, notes (an adopted or resumed file's bytes count
    /// as done).
    fn note(&self, event: ProgressEvent) {
        let line = match event {
            ProgressEvent::FileAdopted {
                path,
                size,
                placement,
            } => {
                advance(&self.total, size);
                format!("{path}: adopted from the Hugging Face cache ({placement}, {size} bytes)")
            }
            ProgressEvent::FileResumedFromCache { path, bytes } => {
                advance(&self.total, bytes);
                format!("{path}: resuming an interrupted hf download at byte {bytes}")
            }
            ProgressEvent::CacheRejected {
                path,
                cache_path,
                reason,
            } => format!("{path}: not using {cache_path} from the Hugging Face cache: {reason}"),
            ProgressEvent::FileRetry {
                path,
                attempt,
                delay,
                retry_after_secs,
                error,
            } => format!(
                "retry {attempt} of {path} in {delay:.1?}{}: {error}",
                waiting_note(retry_after_secs)
            ),
            ProgressEvent::Note { message } => message,
            // The bar events: `report` handles them.
            _ => return,
        };
        self.println(&line);
    }
}

impl Reporter for Bars {
    fn report(&self, event: ProgressEvent) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match event {
            ProgressEvent::FetchPlanned {
                total_bytes,
                done_bytes,
                ..
            } => {
                self.total.set_prefix("total");
                self.total.set_length(total_bytes);
                self.total.set_position(done_bytes.min(total_bytes));
                s.network = 0;
                s.started = Instant::now();
                self.refresh_rate(&mut s, true);
            }
            ProgressEvent::FileStarted {
                path,
                size,
                resumed_from,
            } => self.file_started(&mut s, path, size, resumed_from),
            ProgressEvent::FileBytes { path, bytes } => {
                if let Some(b) = s.files.get(&path) {
                    advance(b, bytes);
                }
                advance(&self.total, bytes);
                s.network = s.network.saturating_add(bytes);
                self.refresh_rate(&mut s, false);
            }
            ProgressEvent::FileRewound { path, to, .. } => {
                if let Some(b) = s.files.get(&path) {
                    let back = b.position().saturating_sub(to);
                    b.set_position(to);
                    self.total
                        .set_position(self.total.position().saturating_sub(back));
                }
            }
            ProgressEvent::FilePublished { path, .. } => self.file_done(&mut s, &path),
            ProgressEvent::FileFailed { path, error } => {
                self.file_done(&mut s, &path);
                self.println(&format!("failed: {path}: {error}"));
            }
            ProgressEvent::ConvertPlanned {
                total_bytes,
                done_bytes,
                ..
            } => {
                if self.convert.is_hidden() {
                    self.multi.add(self.convert.clone());
                }
                self.convert.set_length(total_bytes);
                self.convert.set_position(done_bytes.min(total_bytes));
            }
            ProgressEvent::ComponentWritten { size, .. } => advance(&self.convert, size),
            e @ (ProgressEvent::FileAdopted { .. }
            | ProgressEvent::FileResumedFromCache { .. }
            | ProgressEvent::CacheRejected { .. }
            | ProgressEvent::FileRetry { .. }
            | ProgressEvent::Note { .. }) => self.note(e),
        }
    }

    fn finish(&self) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        for (_, b) in s.files.drain() {
            b.finish_and_clear();
            self.multi.remove(&b);
        }
        self.total.finish_and_clear();
        self.convert.finish_and_clear();
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

/// Bytes done of a total.
#[derive(Default)]
struct Tally {
    total: u64,
    done: u64,
}

/// The fetch and the conversion are counted apart: a pipelined `run`
/// reports both at once.
struct LogState {
    fetch: Tally,
    convert: Tally,
    last: Instant,
}

impl LogLines {
    pub fn new() -> LogLines {
        LogLines {
            state: Mutex::new(LogState {
                fetch: Tally::default(),
                convert: Tally::default(),
                last: Instant::now(),
            }),
        }
    }
}

impl Reporter for LogLines {
    fn report(&self, event: ProgressEvent) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let line = match event {
            e @ (ProgressEvent::FetchPlanned { .. }
            | ProgressEvent::FileBytes { .. }
            | ProgressEvent::FileAdopted { .. }
            | ProgressEvent::FileResumedFromCache { .. }) => fetch_tally_line(&mut s, e),
            e @ (ProgressEvent::ConvertPlanned { .. } | ProgressEvent::ComponentWritten { .. }) => {
                convert_tally_line(&mut s.convert, e)
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
            ProgressEvent::FilePublished { path, size, .. } => Some(format!(
                "{path}: verified and published ({})",
                human::bytes(size)
            )),
            ProgressEvent::FileFailed { path, error } => Some(format!("{path}: failed: {error}")),
            ProgressEvent::CacheRejected {
                path,
                cache_path,
                reason,
            } => Some(format!(
                "{path}: not using {cache_path} from the Hugging Face cache: {reason}"
            )),
            ProgressEvent::Note { message } => Some(message),
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

/// The line of an event that moves the fetch's tally (planned, bytes
/// received, adopted or resumed from the cache); bytes print a progress
/// line at most every 5 s.
fn fetch_tally_line(s: &mut LogState, event: ProgressEvent) -> Option<String> {
    match event {
        ProgressEvent::FetchPlanned {
            files,
            total_bytes,
            done_bytes,
        } => {
            s.fetch = Tally {
                total: total_bytes,
                done: done_bytes,
            };
            Some(format!(
                "fetch: {files} files, {}, {} already durable",
                human::bytes(total_bytes),
                human::bytes(done_bytes)
            ))
        }
        ProgressEvent::FileBytes { bytes, .. } => {
            s.fetch.done = s.fetch.done.saturating_add(bytes);
            if s.last.elapsed() < Duration::from_secs(5) {
                return None;
            }
            s.last = Instant::now();
            Some(format!(
                "progress: {} of {}",
                human::bytes(s.fetch.done),
                human::bytes(s.fetch.total)
            ))
        }
        ProgressEvent::FileAdopted {
            path,
            size,
            placement,
        } => {
            s.fetch.done = s.fetch.done.saturating_add(size);
            Some(format!(
                "{path}: adopted from the Hugging Face cache ({placement}, {})",
                human::bytes(size)
            ))
        }
        ProgressEvent::FileResumedFromCache { path, bytes } => {
            s.fetch.done = s.fetch.done.saturating_add(bytes);
            Some(format!(
                "{path}: resuming an interrupted hf download at byte {bytes}"
            ))
        }
        // Not a fetch tally event: `LogLines::report` prints it.
        _ => None,
    }
}

/// The line of an event that moves the conversion's tally.
fn convert_tally_line(tally: &mut Tally, event: ProgressEvent) -> Option<String> {
    match event {
        ProgressEvent::ConvertPlanned {
            components,
            total_bytes,
            done_bytes,
        } => {
            *tally = Tally {
                total: total_bytes,
                done: done_bytes,
            };
            Some(format!(
                "convert: {components} components, {}, {} already durable",
                human::bytes(total_bytes),
                human::bytes(done_bytes)
            ))
        }
        ProgressEvent::ComponentWritten { path, kind, size } => {
            tally.done = tally.done.saturating_add(size);
            Some(format!(
                "{path}: {kind} written and durable ({}; {} of {})",
                human::bytes(size),
                human::bytes(tally.done),
                human::bytes(tally.total)
            ))
        }
        // Not a conversion tally event: `LogLines::report` prints it.
        _ => None,
    }
}

/// Newline-delimited JSON events on stdout.
pub struct JsonLines;

impl Reporter for JsonLines {
    fn report(&self, event: ProgressEvent) {
        let _ = crate::output::json_line(&event);
    }
}

/// What a retry waits for when the hub set `Retry-After`.
fn waiting_note(retry_after_secs: Option<u64>) -> String {
    match retry_after_secs {
        Some(secs) => format!(
            " (waiting for the hub: Retry-After {secs} s, capped at {} s)",
            ftpipe_hub::limits::MAX_RETRY_AFTER.as_secs()
        ),
        None => String::new(),
    }
}
