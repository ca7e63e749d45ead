//! Progress display: the only place that knows indicatif. Four flavours
//! behind the stages' `Reporter` trait: bars on a TTY, periodic log lines
//! (not a TTY), newline-delimited JSON (`--json`), and nothing (`--quiet`:
//! errors still reach stderr through the exit path).

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use indicatif::{
    MultiProgress, ProgressBar, ProgressDrawTarget, ProgressState, ProgressStyle, TermLike,
};

use ftpipe_progress::{Phase, ProgressEvent, Reporter, human};

/// `--quiet`: no progress at all.
pub struct Silent;

impl Reporter for Silent {
    fn report(&self, _event: ProgressEvent) {}
}

/// Bars: a total (bytes and files done, network rate, ETA, elapsed time),
/// one per file in flight, and, once a conversion is planned, its own bar
/// below (a pipelined `run` fetches and converts at once: both show).
/// Until the fetch knows its sizes the total is a spinner with the stage
/// (`resolving`, `planning`, ...), never a bar of 0 bytes. Bytes already
/// durable or taken from the Hugging Face cache count as done but not
/// towards the rate; no bar goes past its length. While transfers wait to
/// retry, one status line under the bars says why, how many files wait and
/// when the next retry is (each attempt is in the attempts table and the
/// `FTPIPE_LOG=debug` log, not on screen).
pub struct Bars {
    multi: MultiProgress,
    total: ProgressBar,
    convert: ProgressBar,
    /// What the total bar's own keys (`{files}`, `{rate}`) read.
    shared: Arc<Mutex<Shared>>,
    state: Mutex<BarState>,
    /// Set by [`Reporter::finish`]: later events (tasks still winding
    /// down after an interrupt) draw nothing.
    closed: AtomicBool,
}

struct BarState {
    files: HashMap<String, ProgressBar>,
    /// Whether the fetch's sizes are known (the total is a bar).
    planned: bool,
    /// The outage line under the bars, while a file waits to retry.
    status: Option<ProgressBar>,
}

/// The total bar's figures that change between events (the style's keys
/// read them at every tick, so a stall shows while no event comes).
#[derive(Default)]
struct Shared {
    files: usize,
    files_done: usize,
    /// Network bytes of this process: (when, running sum), oldest first,
    /// spanning about [`RATE_WINDOW`].
    samples: VecDeque<(Instant, u64)>,
    network: u64,
    /// When the last network byte came (or the fetch began).
    last_bytes: Option<Instant>,
    /// Files waiting to retry: why and when.
    waiting: HashMap<String, Waiting>,
}

/// A file waiting for its next attempt.
struct Waiting {
    cause: String,
    retry_at: Instant,
}

/// The rate is the network bytes of this window.
const RATE_WINDOW: Duration = Duration::from_secs(5);
/// No network byte for this long: the rate and ETA say `stalled`.
const STALLED_AFTER: Duration = Duration::from_secs(3);
/// How often the bars redraw with no event (the stall and the retry
/// countdown move on their own).
const TICK: Duration = Duration::from_millis(250);
/// Longest retry cause shown on the status line.
const MAX_CAUSE_CHARS: usize = 80;

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

/// The total bar's style once sizes are known, with its `{files}` and
/// `{rate}` keys reading `shared`.
fn total_style(shared: &Arc<Mutex<Shared>>) -> ProgressStyle {
    let files = shared.clone();
    let rate = shared.clone();
    bar_style(
        "{prefix:>8} [{bar:40}] {percent:>3}% {size}/{total_size} {files} files {rate} \
         {elapsed_precise}",
    )
    .with_key("files", move |_: &ProgressState, w: &mut dyn fmt::Write| {
        let s = lock(&files);
        let _ = write!(w, "{}/{}", s.files_done.min(s.files), s.files);
    })
    .with_key("rate", move |st: &ProgressState, w: &mut dyn fmt::Write| {
        let left = st.len().unwrap_or(0).saturating_sub(st.pos());
        let _ = w.write_str(&lock(&rate).rate_text(Instant::now(), left));
    })
}

/// The total's style before sizes are known: the stage and elapsed time.
fn phase_style() -> ProgressStyle {
    ProgressStyle::with_template("{prefix:>8} {spinner} {msg} {elapsed_precise}")
        .unwrap_or_else(|_| ProgressStyle::default_spinner())
}

/// The outage line's style, its `{outage}` key reading `shared`.
fn status_style(shared: &Arc<Mutex<Shared>>) -> ProgressStyle {
    let shared = shared.clone();
    ProgressStyle::with_template("{outage}")
        .unwrap_or_else(|_| ProgressStyle::default_spinner())
        .with_key(
            "outage",
            move |_: &ProgressState, w: &mut dyn fmt::Write| {
                let _ = w.write_str(&lock(&shared).outage_text(Instant::now()));
            },
        )
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    fn fetch_planned(&mut self, files: usize, done: usize, now: Instant) {
        self.files = files;
        self.files_done = done;
        self.network = 0;
        self.samples = VecDeque::from([(now, 0)]);
        self.last_bytes = Some(now);
    }

    fn bytes(&mut self, path: &str, bytes: u64, now: Instant) {
        self.network = self.network.saturating_add(bytes);
        self.last_bytes = Some(now);
        self.waiting.remove(path);
        self.samples.push_back((now, self.network));
        while self.samples.len() > 2
            && self
                .samples
                .get(1)
                .is_some_and(|(t, _)| now.duration_since(*t) >= RATE_WINDOW)
        {
            self.samples.pop_front();
        }
    }

    /// `1.2 MiB/s ETA 3m`, or `stalled 12s ETA -` when no network byte
    /// came for [`STALLED_AFTER`]; `left`: bytes still to come.
    fn rate_text(&self, now: Instant, left: u64) -> String {
        let Some(last) = self.last_bytes else {
            return String::new();
        };
        let quiet = now.duration_since(last);
        if quiet >= STALLED_AFTER && left > 0 {
            return format!("stalled {}s ETA -", quiet.as_secs());
        }
        let rate = match self.samples.front() {
            Some((t, sum)) => {
                let secs = now.duration_since(*t).as_secs_f64().max(1e-3);
                (self.network - sum) as f64 / secs
            }
            None => 0.0,
        };
        let eta = if left == 0 {
            "ETA 0s".to_owned()
        } else if rate >= 1.0 {
            format!(
                "ETA {}",
                indicatif::HumanDuration(Duration::from_secs_f64(left as f64 / rate))
            )
        } else {
            "ETA -".to_owned()
        };
        #[expect(clippy::cast_sign_loss, reason = "a non-negative rate; `as` saturates")]
        let rate = rate as u64;
        format!("{}/s {eta}", human::bytes(rate))
    }

    /// The outage line: the latest cause, the files waiting, the next retry.
    fn outage_text(&self, now: Instant) -> String {
        let Some(next) = self.waiting.values().min_by_key(|w| w.retry_at) else {
            return String::new();
        };
        let latest = self
            .waiting
            .values()
            .max_by_key(|w| w.retry_at)
            .map_or("", |w| w.cause.as_str());
        let wait = next.retry_at.saturating_duration_since(now);
        format!(
            "  source unavailable: {latest}; {} file(s) waiting; next retry in {:.0}s",
            self.waiting.len(),
            wait.as_secs_f64().ceil()
        )
    }
}

/// The cause of a failed attempt, short: the URLs dropped (the attempts
/// table keeps the whole message) and the last cause of the chain kept
/// (messages end with their cause's text, `: `-separated).
fn short_cause(error: &str) -> String {
    let words: Vec<&str> = error.split(' ').filter(|w| !w.contains("://")).collect();
    let text = words.join(" ");
    // `URL answered HTTP 503 (...)[: the hub's own words]`: the status and
    // what follows it, the hub's words included.
    if let Some(at) = text.find("answered HTTP ") {
        let cause = text.get(at + "answered ".len()..).unwrap_or("").trim();
        return cause.chars().take(MAX_CAUSE_CHARS).collect();
    }
    let last = text
        .rsplit(": ")
        .map(str::trim)
        .find(|part| !part.is_empty())
        .unwrap_or("");
    let cause = if last.is_empty() { text.trim() } else { last };
    cause.chars().take(MAX_CAUSE_CHARS).collect()
}

/// Moves `bar` forward by `by`, never past its length.
fn advance(bar: &ProgressBar, by: u64) {
    let len = bar.length().unwrap_or(u64::MAX);
    bar.set_position(bar.position().saturating_add(by).min(len));
}

/// How often the bars redraw at most (indicatif's own rate for stderr).
const DRAWS_PER_SEC: u8 = 20;

/// Stderr as the bars' terminal, with one change: indicatif pads each line
/// with spaces to the terminal's width and lets the terminal wrap to the
/// next line, so after a draw the cursor waits at the right edge. A Ctrl-C
/// typed then is echoed as `^C` on a new line, one below where indicatif
/// believes the cursor is, and its clearing then left the top bar on
/// screen. Here the padding is an erase to the end of the line and the
/// line break a `\r\n` written only when the next line starts: the cursor
/// stays right after the last line's text.
#[derive(Debug)]
struct EdgeFreeTerm {
    term: console::Term,
    /// A line was padded: the next text starts on the next line.
    newline_pending: AtomicBool,
}

impl EdgeFreeTerm {
    fn stderr() -> EdgeFreeTerm {
        EdgeFreeTerm {
            term: console::Term::buffered_stderr(),
            newline_pending: AtomicBool::new(false),
        }
    }

    /// A cursor move or a clear: the pending line break is not needed.
    fn moved(&self) {
        self.newline_pending.store(false, Ordering::SeqCst);
    }
}

impl TermLike for EdgeFreeTerm {
    fn width(&self) -> u16 {
        self.term.size().1
    }

    fn height(&self) -> u16 {
        self.term.size().0
    }

    fn move_cursor_up(&self, n: usize) -> std::io::Result<()> {
        self.moved();
        self.term.move_cursor_up(n)
    }

    fn move_cursor_down(&self, n: usize) -> std::io::Result<()> {
        self.moved();
        self.term.move_cursor_down(n)
    }

    fn move_cursor_right(&self, n: usize) -> std::io::Result<()> {
        self.term.move_cursor_right(n)
    }

    fn move_cursor_left(&self, n: usize) -> std::io::Result<()> {
        self.term.move_cursor_left(n)
    }

    fn write_line(&self, s: &str) -> std::io::Result<()> {
        self.write_str(s)?;
        self.newline_pending.store(false, Ordering::SeqCst);
        self.term.write_str("\n")
    }

    /// A non-empty run of spaces is a line's padding (indicatif writes the
    /// text and its padding apart): erased to the line's end instead, the
    /// break kept for the next text.
    fn write_str(&self, s: &str) -> std::io::Result<()> {
        if !s.is_empty() && s.bytes().all(|b| b == b' ') {
            self.newline_pending.store(true, Ordering::SeqCst);
            return self.term.write_str("\x1b[K");
        }
        if s.is_empty() {
            return Ok(());
        }
        if self.newline_pending.swap(false, Ordering::SeqCst) {
            self.term.write_str("\r\n")?;
        }
        self.term.write_str(s)
    }

    fn clear_line(&self) -> std::io::Result<()> {
        self.moved();
        self.term.clear_line()
    }

    fn flush(&self) -> std::io::Result<()> {
        self.term.flush()
    }
}

/// The bars alive in this process, so an interrupt can clear them.
static LIVE: Mutex<Vec<Weak<Bars>>> = Mutex::new(Vec::new());

/// Clears every live bar display and stops it drawing (an interrupt: its
/// one line must be the last thing on the screen).
pub fn clear_live_bars() {
    for bars in lock(&LIVE).drain(..) {
        if let Some(bars) = bars.upgrade() {
            bars.finish();
        }
    }
}

impl Bars {
    /// Bars on stderr, registered for [`clear_live_bars`].
    pub fn live() -> Arc<Bars> {
        let bars = Arc::new(Bars::new());
        let mut live = lock(&LIVE);
        live.retain(|w| w.strong_count() > 0);
        live.push(Arc::downgrade(&bars));
        bars
    }

    fn new() -> Bars {
        let multi = MultiProgress::with_draw_target(ProgressDrawTarget::term_like_with_hz(
            Box::new(EdgeFreeTerm::stderr()),
            DRAWS_PER_SEC,
        ));
        let total = multi.add(ProgressBar::new_spinner());
        total.set_style(phase_style());
        total.set_prefix("total");
        total.set_message("starting");
        total.enable_steady_tick(TICK);
        let convert = ProgressBar::hidden();
        convert.set_style(bar_style(
            "{prefix:>8} [{bar:40}] {percent:>3}% {size}/{total_size} {msg}",
        ));
        convert.set_prefix("convert");
        Bars {
            multi,
            total,
            convert,
            shared: Arc::new(Mutex::new(Shared::default())),
            state: Mutex::new(BarState {
                files: HashMap::new(),
                planned: false,
                status: None,
            }),
            closed: AtomicBool::new(false),
        }
    }

    /// The fetch's sizes are known: the total becomes a bar.
    fn fetch_planned(
        &self,
        s: &mut BarState,
        files: usize,
        done_files: usize,
        total: u64,
        done: u64,
    ) {
        lock(&self.shared).fetch_planned(files, done_files, Instant::now());
        if !s.planned {
            s.planned = true;
            self.total.set_style(total_style(&self.shared));
        }
        self.total.set_position(done.min(total));
        self.total.set_length(total);
        // With its steady tick a bar draws a new position only at the next
        // tick: the durable bytes show from the first frame.
        self.total.force_draw();
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

    /// Removes the bar of a file that is published or failed; it no
    /// longer waits for a retry.
    fn file_done(&self, s: &mut BarState, path: &str) {
        if let Some(b) = s.files.remove(path) {
            b.finish_and_clear();
            self.multi.remove(&b);
        }
        lock(&self.shared).waiting.remove(path);
        self.sync_status(s);
    }

    /// Shows the outage line while a file waits to retry, removes it once
    /// none does.
    fn sync_status(&self, s: &mut BarState) {
        let waiting = !lock(&self.shared).waiting.is_empty();
        match (&s.status, waiting) {
            (None, true) => {
                let bar = self
                    .multi
                    .insert_after(&self.total, ProgressBar::new_spinner());
                bar.set_style(status_style(&self.shared));
                bar.enable_steady_tick(TICK);
                s.status = Some(bar);
            }
            (Some(bar), false) => {
                bar.finish_and_clear();
                self.multi.remove(bar);
                s.status = None;
            }
            _ => {}
        }
    }

    /// A failed attempt to be retried: on the outage line, not a line of
    /// its own.
    fn file_retry(&self, s: &mut BarState, path: String, delay: Duration, error: &str) {
        let waiting = Waiting {
            cause: short_cause(error),
            retry_at: Instant::now() + delay,
        };
        lock(&self.shared).waiting.insert(path, waiting);
        self.sync_status(s);
    }

    /// Prints `line` above the bars, redacted.
    fn println(&self, line: &str) {
        let _ = self.multi.println(crate::output::redacted(line));
    }

    /// An event that is a line above the bars: the cache's adoptions and
    /// rejections, notes (an adopted or resumed file's bytes count as done).
    fn note(&self, event: ProgressEvent) {
        let line = match event {
            ProgressEvent::FileAdopted {
                path,
                size,
                placement,
            } => {
                advance(&self.total, size);
                lock(&self.shared).files_done += 1;
                format!("{path}: adopted from the Hugging Face cache ({placement}, {size} bytes)")
            }
            ProgressEvent::FileResumedFromCache { path, bytes } => {
                advance(&self.total, bytes);
                format!("{path}: resuming an interrupted hf download at byte {bytes}")
            }
            ProgressEvent::FileTailKept { path, from, to } => tail_kept_line(&path, from, to),
            ProgressEvent::CacheRejected {
                path,
                cache_path,
                reason,
            } => format!("{path}: not using {cache_path} from the Hugging Face cache: {reason}"),
            ProgressEvent::Note { message } => message,
            ProgressEvent::ComponentKept { path, kind, size } => kept_line(&path, &kind, size),
            // The bar events: `report` handles them.
            _ => return,
        };
        self.println(&line);
    }

    /// A stage started: its name beside the spinner until sizes are known.
    fn phase(&self, s: &BarState, phase: Phase) {
        if !s.planned {
            self.total.set_message(phase.label());
        }
    }
}

impl Reporter for Bars {
    fn report(&self, event: ProgressEvent) {
        // Checked under the state lock `finish` sets it under: no event
        // draws after the bars are cleared.
        let mut s = lock(&self.state);
        if self.closed.load(Ordering::SeqCst) {
            return;
        }
        match event {
            ProgressEvent::FetchPlanned {
                files,
                done_files,
                total_bytes,
                done_bytes,
            } => self.fetch_planned(&mut s, files, done_files, total_bytes, done_bytes),
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
                lock(&self.shared).bytes(&path, bytes, Instant::now());
                self.sync_status(&mut s);
            }
            ProgressEvent::FileRewound { path, to, .. } => {
                if let Some(b) = s.files.get(&path) {
                    let back = b.position().saturating_sub(to);
                    b.set_position(to);
                    self.total
                        .set_position(self.total.position().saturating_sub(back));
                }
            }
            ProgressEvent::FilePublished { path, .. } => {
                lock(&self.shared).files_done += 1;
                self.file_done(&mut s, &path);
            }
            ProgressEvent::FileFailed { path, error } => {
                self.file_done(&mut s, &path);
                self.println(&format!("failed: {path}: {error}"));
            }
            ProgressEvent::FileRetry {
                path, delay, error, ..
            } => self.file_retry(&mut s, path, delay, &error),
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
            ProgressEvent::Phase { phase } => self.phase(&s, phase),
            e @ (ProgressEvent::FileAdopted { .. }
            | ProgressEvent::FileResumedFromCache { .. }
            | ProgressEvent::FileTailKept { .. }
            | ProgressEvent::CacheRejected { .. }
            | ProgressEvent::ComponentKept { .. }
            | ProgressEvent::Note { .. }) => self.note(e),
        }
    }

    fn finish(&self) {
        let mut s = lock(&self.state);
        self.closed.store(true, Ordering::SeqCst);
        for (_, b) in s.files.drain() {
            b.finish_and_clear();
            self.multi.remove(&b);
        }
        if let Some(b) = s.status.take() {
            b.finish_and_clear();
            self.multi.remove(&b);
        }
        self.total.finish_and_clear();
        self.convert.finish_and_clear();
        let _ = self.multi.clear();
    }
}

/// Bars dropped unfinished (a command future dropped by an interrupt
/// before anything called `finish`) would be left on screen: cleared too.
impl Drop for Bars {
    fn drop(&mut self) {
        self.finish();
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
            ProgressEvent::FileTailKept { path, from, to } => Some(tail_kept_line(&path, from, to)),
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
            ProgressEvent::ComponentKept { path, kind, size } => {
                Some(kept_line(&path, &kind, size))
            }
            // The stage's start is in the stage log (`status`).
            ProgressEvent::Phase { .. } => None,
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
            ..
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

/// The line saying a crash's tail past a checkpoint was kept.
fn tail_kept_line(path: &str, from: u64, to: u64) -> String {
    format!(
        "{path}: kept {} written past the last checkpoint (bytes {from}..{to}): their recorded chunk hashes match",
        human::bytes(to.saturating_sub(from))
    )
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

/// The line of a component a repin kept.
fn kept_line(path: &str, kind: &str, size: u64) -> String {
    format!(
        "{path}: {kind} kept ({}): the repin left the bytes of its spans unchanged",
        human::bytes(size)
    )
}

/// Newline-delimited JSON events on stdout.
pub struct JsonLines;

/// A stage's start (`Phase`) is a hint for the bars, not one of the
/// documented events: it is not printed.
impl Reporter for JsonLines {
    fn report(&self, event: ProgressEvent) {
        if matches!(event, ProgressEvent::Phase { .. }) {
            return;
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durable_bytes_are_done_from_the_plan_on() {
        let bars = Bars::new();
        bars.report(ProgressEvent::Phase {
            phase: Phase::Fetching,
        });
        bars.report(ProgressEvent::FetchPlanned {
            files: 7,
            done_files: 4,
            total_bytes: 100,
            done_bytes: 26,
        });
        assert_eq!(bars.total.length(), Some(100));
        assert_eq!(bars.total.position(), 26);
    }

    #[test]
    fn a_retry_cause_is_short_and_has_no_url() {
        let refused = "request to http://127.0.0.1:9/api/x failed: error sending request for url \
             (http://127.0.0.1:9/api/x): client error (Connect): tcp connect error: Connection \
             refused (os error 111)";
        assert_eq!(short_cause(refused), "Connection refused (os error 111)");
        let status = "http://127.0.0.1:9/lfs/ab answered HTTP 503 (fetching a.safetensors)";
        assert_eq!(short_cause(status), "HTTP 503 (fetching a.safetensors)");
        let says = "https://hub/x answered HTTP 503 (fetching a.safetensors): fixture fault";
        assert_eq!(
            short_cause(says),
            "HTTP 503 (fetching a.safetensors): fixture fault"
        );
        assert!(short_cause(&"x".repeat(500)).chars().count() <= MAX_CAUSE_CHARS);
    }
}
