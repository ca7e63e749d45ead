//! Ctrl-C (SIGINT) and SIGTERM during a command that writes DIR (`fetch`,
//! `run`, `convert`, `pull`, `publish`, `mirror`).
//!
//! The signal drops the command's future where it waits: every byte and
//! receipt the database claims was fsynced before its row (the order every
//! durable write keeps), and a write in flight is simply not claimed, as
//! after a kill. Then the bars are cleared, the runtime is shut down (its
//! tasks dropped the same way), and one line says what DIR holds durably
//! and that the same command resumes; the exit code is 130 for SIGINT and
//! 143 for SIGTERM (128 + the signal's number, as a shell reports it).

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use tokio::signal::unix::{SignalKind, signal};

use crate::cli::Command;

/// The signals that stop a command tidily.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// Ctrl-C.
    Interrupt,
    /// `kill`, a scheduler's preemption.
    Terminate,
}

impl Signal {
    fn name(self) -> &'static str {
        match self {
            Signal::Interrupt => "SIGINT",
            Signal::Terminate => "SIGTERM",
        }
    }

    /// 128 + the signal's number.
    pub fn exit_code(self) -> u8 {
        match self {
            Signal::Interrupt => crate::exit::INTERRUPTED,
            Signal::Terminate => crate::exit::TERMINATED,
        }
    }
}

/// The directory a command writes.
pub struct WorkDir {
    dir: PathBuf,
    /// Whether its selection's files and bytes say what the command did
    /// (not for `publish` and `mirror`, which upload what DIR holds).
    fetches: bool,
}

/// A command that a signal stopped, and the directory it was writing.
pub struct Interrupted {
    signal: Signal,
    work: WorkDir,
}

/// How a command ended.
pub enum Ended {
    /// It ran to its end (success or error).
    Done(anyhow::Result<bool>),
    /// A signal stopped it.
    Interrupted(Interrupted),
}

/// How long the shutdown waits for blocking work in flight (a write, an
/// fsync, a hash); what is still running then ends with the process,
/// unclaimed.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(5);

/// The directory `command` writes, when it is one a signal stops tidily.
pub fn work_dir(command: &Command) -> Option<WorkDir> {
    let (dir, fetches) = match command {
        Command::Fetch(a) => (a.hub.out.clone(), true),
        Command::Run(a) => (a.fetch.hub.out.clone(), true),
        Command::Convert(a) => (a.out.clone(), true),
        Command::Pull(a) => (a.out.clone(), true),
        Command::Publish(a) => (a.dir.clone(), false),
        Command::Mirror(a) => (
            a.out.clone().unwrap_or_else(|| a.source.clone().into()),
            false,
        ),
        _ => return None,
    };
    Some(WorkDir { dir, fetches })
}

/// Runs `work` until it ends or, when `dir` is set, SIGINT or SIGTERM
/// comes (the bars are cleared at once then).
pub async fn until_signal<F>(dir: Option<WorkDir>, work: F) -> Ended
where
    F: Future<Output = anyhow::Result<bool>>,
{
    let Some(dir) = dir else {
        return Ended::Done(work.await);
    };
    let (mut int, mut term) = match (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) {
        (Ok(int), Ok(term)) => (int, term),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("ftpipe: cannot handle SIGINT/SIGTERM ({e}); they end it as a kill does");
            return Ended::Done(work.await);
        }
    };
    let signal = tokio::select! {
        result = work => return Ended::Done(result),
        _ = int.recv() => Signal::Interrupt,
        _ = term.recv() => Signal::Terminate,
    };
    crate::report::clear_live_bars();
    Ended::Interrupted(Interrupted { signal, work: dir })
}

/// Shuts `runtime` down, says what is durable and how to resume; the
/// signal's exit code.
pub fn stop(runtime: tokio::runtime::Runtime, stopped: &Interrupted) -> ExitCode {
    runtime.shutdown_timeout(SHUTDOWN_WAIT);
    let work = &stopped.work;
    let durable = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .ok()
        .filter(|_| work.fetches)
        .and_then(|rt| rt.block_on(durable_state(&work.dir)));
    eprintln!(
        "ftpipe: stopped by {}: everything recorded in {} is durable{}; bytes in flight were \
         not recorded. Run the same command again to resume.",
        stopped.signal.name(),
        work.dir.display(),
        durable.map(|d| format!(" ({d})")).unwrap_or_default()
    );
    ExitCode::from(stopped.signal.exit_code())
}

/// What DIR's database records: files published and bytes durable of the
/// selection, components written. `None` without a database.
async fn durable_state(dir: &Path) -> Option<String> {
    let status = ftpipe_pipeline::status(dir).await.ok()?;
    let mut text = format!(
        "{} of {} files published, {} of {} bytes durable",
        status.published, status.files, status.durable_bytes, status.expected_bytes
    );
    let (_, store) = ftpipe_pipeline::open_existing(dir).await.ok()?;
    let components = store.components().await.ok()?;
    if !components.is_empty() {
        text.push_str(&format!(
            ", {} artifact component(s) written",
            components.len()
        ));
    }
    Some(text)
}
