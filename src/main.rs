//! `ftpipe`: the command line. Thin on purpose: parse arguments, pick a
//! progress display, call the pipeline, print, and map errors to exit codes.
//!
//! Modules:
//! - `cli`: the clap tree and one module per command (its flags and its
//!   handler), the argument groups they share, the summary they print.
//! - `cli_docs`: `completions` and `man`, rendered from the clap tree.
//! - `demo`: `ftpipe demo` (and `demo --serve`).
//! - `interrupt`: SIGINT/SIGTERM during a command that writes DIR.
//! - `output`: every print, through the redaction point.
//! - `report`: progress display (bars, log lines, JSON lines, nothing).
//! - `table`, `verify_view`: the audit and inspection tables, the verify
//!   block.
//! - `size`: the parser of every size flag.
//! - `exit`: the table of exit codes (README and man page are made from
//!   it) and the map from error classes to codes.
//! - `advice`: the one sentence with the fix for common failures.
//!
//! This file: `main` (parse, start the runtime, dispatch) and the one map
//! from errors to their class (and so, through `exit`, their code).

// Unit tests see every dev-dependency; the lint is for the library itself.
#![cfg_attr(test, allow(unused_crate_dependencies))]
// Unit tests build their inputs with plain `std::fs` calls (clippy.toml).
#![cfg_attr(test, allow(clippy::disallowed_methods))]

/// Every print of the binary goes through [`output`] (the redaction
/// point): these shadow std's macros for the whole crate.
macro_rules! print {
    ($($arg:tt)*) => { $crate::output::stdout(&format!($($arg)*)) };
}
/// See [`print!`].
macro_rules! println {
    () => { $crate::output::stdout("\n") };
    ($($arg:tt)*) => { $crate::output::stdout(&format!("{}\n", format_args!($($arg)*))) };
}
/// See [`print!`].
macro_rules! eprintln {
    ($($arg:tt)*) => { $crate::output::stderr(&format!("{}\n", format_args!($($arg)*))) };
}

mod advice;
mod cli;
mod cli_docs;
mod demo;
mod exit;
mod interrupt;
mod output;
mod report;
mod size;
mod table;
mod verify_view;

use std::process::ExitCode;

use ftpipe_artifact::ArtifactError;
use ftpipe_convert::ConvertError;
use ftpipe_fetch::FetchError;
use ftpipe_fs::{ErrorClass, FsError};
use ftpipe_hub::HubError;
use ftpipe_hub::token::load_token;
use ftpipe_pipeline::PipelineError;

use cli::examine::{AuditInProgress, VerifyFailed};
use cli::{Cli, Command};
// Dependencies only for their features: a build of this package alone
// compiles them as the workspace's test build does (Cargo.toml).
use libc as _;
use regex_syntax as _;

/// Runs `cli`'s command: `Ok(false)` is an audit that is not clean.
async fn run(cli: Cli) -> anyhow::Result<bool> {
    // Every subcommand registers the ambient token (`HF_TOKEN`,
    // `HF_TOKEN_PATH`, `$HF_HOME/token`) with the redaction point, so a
    // config, header or error echoing it is caught even by commands that
    // never send it (convert, status, verify, inspect). A source that cannot
    // be read is reported by the commands that do send the token.
    let _ambient = load_token(None);
    match cli.command {
        Command::Fetch(args) => cli::fetch::run(args).await,
        Command::Status(args) => cli::examine::status(args).await,
        Command::Audit(args) => cli::examine::audit(args).await,
        Command::Plan(args) => cli::plan::run(args).await,
        Command::Convert(args) => cli::convert::run(args).await,
        Command::Run(args) => cli::run::run(args).await,
        Command::Publish(args) => cli::publish::run(args).await,
        Command::Pull(args) => cli::pull::run(args).await,
        Command::Mirror(args) => cli::mirror::run(args).await,
        Command::Inspect(args) => cli::examine::inspect(&args),
        Command::Verify(args) => cli::examine::verify(&args),
        Command::Demo { out, serve: false } => demo::run(out).await,
        Command::Demo { out, serve: true } => demo::serve(out).await,
        Command::Completions { shell } => cli_docs::print_completions(shell),
        Command::Man { command, dir } => cli_docs::man(command.as_deref(), dir.as_deref()),
    }
}

/// The error and its causes, `: `-separated, skipping a cause whose text
/// the message already ends with. The rule for the library errors: a
/// message ends with its cause's text (`{source}`), which stays the
/// `#[source]` for exit codes; so the line names the file/URL and the cause
/// once, and an anyhow context here gets its cause appended.
fn describe(err: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in err.chain() {
        let text = cause.to_string();
        if out.ends_with(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

/// The class of one error of the chain when it is one of ftpipe's own
/// (the libraries' and the binary's [`VerifyFailed`]). A transparent
/// variant forwards its source, so a wrapped error never appears in the
/// chain by itself: the outer type's `class` answers for it.
fn class_of(cause: &(dyn std::error::Error + 'static)) -> Option<ErrorClass> {
    if let Some(e) = cause.downcast_ref::<PipelineError>() {
        return Some(e.class());
    }
    if let Some(e) = cause.downcast_ref::<FetchError>() {
        return Some(e.class());
    }
    if let Some(e) = cause.downcast_ref::<ConvertError>() {
        return Some(e.class());
    }
    if let Some(e) = cause.downcast_ref::<HubError>() {
        return Some(e.class());
    }
    if let Some(e) = cause.downcast_ref::<ArtifactError>() {
        return Some(e.class());
    }
    if let Some(e) = cause.downcast_ref::<FsError>() {
        return Some(e.class());
    }
    if let Some(e) = cause.downcast_ref::<ftpipe_objstore::ObjStoreError>() {
        return Some(e.class());
    }
    if cause.downcast_ref::<VerifyFailed>().is_some() {
        return Some(ErrorClass::Verification);
    }
    if cause.downcast_ref::<AuditInProgress>().is_some() {
        return Some(ErrorClass::Locked);
    }
    None
}

/// The class of a failure: the most severe that any error of its chain
/// says it is (a full disk anywhere, an io error with `ENOSPC` included,
/// is [`ErrorClass::NoSpace`]).
fn error_class(err: &anyhow::Error) -> ErrorClass {
    let root: &(dyn std::error::Error + 'static) = err.as_ref();
    ErrorClass::worst(
        err.chain()
            .filter_map(class_of)
            .chain([ErrorClass::of_chain(root)]),
    )
}

fn exit_code(err: &anyhow::Error) -> u8 {
    exit::class_code(error_class(err))
}

/// Prints a failure: the sentence with the fix when there is one, then the
/// exact error (stderr); with `--json` also one `error` event on stdout
/// holding both and the exit code. Returns the exit code.
fn report_error(err: &anyhow::Error, facts: &advice::Facts, json: bool) -> u8 {
    let code = exit_code(err);
    let details = describe(err);
    let fix = advice::advice(err, facts);
    if json {
        let event = serde_json::json!({
            "event": "error",
            "exit_code": code,
            "error": details,
            "advice": fix,
        });
        let _ = output::json_line(&event);
    }
    match fix {
        Some(fix) => eprintln!("ftpipe: {fix}\nftpipe: details: {details}"),
        None => eprintln!("ftpipe: {details}"),
    }
    code
}

/// Threads the runtime may start beyond its workers when no conversion
/// runs: a worker entering `block_in_place` (file writes, fsync, hashing)
/// hands its core to one of these.
const SPARE_BLOCKING_THREADS: usize = 2;

/// The runtime's bound on blocking threads for `command`: the spare ones
/// plus one per parallel conversion (each a `spawn_blocking` task).
///
/// Each thread gets its own glibc malloc arena, so tokio's default of 512
/// let a fetch grow to ~86 threads and ~65 MB resident. A full pool cannot
/// deadlock: every blocking closure is finite file or CPU work that waits on
/// no async task, and a core whose hand-off thread has not started yet is
/// taken back by its own thread when the closure returns.
fn blocking_threads(command: &Command) -> usize {
    SPARE_BLOCKING_THREADS + command.parallel_conversions()
}

/// jemalloc keeps freed memory for reuse for a while (10 s) instead of
/// handing it back to the kernel at once. A fetch frees and reallocates
/// read buffers of hundreds of KiB all the time; with glibc's malloc every
/// new buffer cost fresh zeroed pages (69,000–445,000 page faults per
/// 4.3 GB loopback fetch; see docs/performance.md).
#[cfg(all(target_os = "linux", not(target_env = "musl")))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    output::install_panic_hook();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("FTPIPE_LOG")
                .unwrap_or_else(|_| "error".into()),
        )
        .with_writer(output::LogWriter::default)
        .init();
    let cli = Cli::parse_args();
    let facts = advice::Facts::of(&cli.command);
    let json = cli.command.json();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .max_blocking_threads(blocking_threads(&cli.command))
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("ftpipe: cannot start the async runtime: {e}");
            return ExitCode::from(exit::FAILURE);
        }
    };
    let work_dir = interrupt::work_dir(&cli.command);
    let result = match runtime.block_on(interrupt::until_signal(work_dir, run(cli))) {
        interrupt::Ended::Done(result) => result,
        interrupt::Ended::Interrupted(stopped) => return interrupt::stop(runtime, &stopped),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!(
                "ftpipe: the audit is not clean: a selected file is not published and verified, \
                 a component or the manifest does not match its receipts, or the ledger does not \
                 reconcile (see the problems above)"
            );
            ExitCode::from(exit::AUDIT_FAILED)
        }
        Err(e) => ExitCode::from(report_error(&e, &facts, json)),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[test]
    fn each_parallel_conversion_keeps_a_blocking_thread() {
        let threads = |args: &[&str]| {
            let cli = Cli::try_parse_from(args).expect("valid command line");
            blocking_threads(&cli.command)
        };
        let fetch = threads(&["ftpipe", "fetch", "a/b", "--out", "d", "--jobs", "64"]);
        assert_eq!(fetch, SPARE_BLOCKING_THREADS);
        let run = threads(&["ftpipe", "run", "a/b", "--out", "d", "--convert-jobs", "5"]);
        assert_eq!(run, SPARE_BLOCKING_THREADS + 5);
    }

    #[test]
    fn exit_codes_follow_the_cause_not_the_command() {
        let verify = anyhow::Error::from(PipelineError::VerifyFailed {
            artifact: "a".into(),
            problems: vec!["model.ftw: sha256: differs".into()],
        });
        assert_eq!(exit_code(&verify), exit::VERIFY_FAILED);
        let full = std::io::Error::from(std::io::ErrorKind::StorageFull);
        let in_conversion =
            anyhow::Error::from(PipelineError::Convert(ConvertError::io("write", "x", full)));
        assert_eq!(exit_code(&in_conversion), exit::NO_SPACE);
        let other = std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        let denied = anyhow::Error::from(PipelineError::Fetch(FetchError::io("write", "x", other)));
        assert_eq!(exit_code(&denied), exit::FAILURE);
        let join = std::io::Error::other("task panicked");
        let task = FetchError::internal_from("conversion task", join);
        assert!(
            task.to_string().ends_with("conversion task: task panicked"),
            "{task}"
        );
        let in_pipeline = anyhow::Error::from(PipelineError::Fetch(task));
        assert_eq!(exit_code(&in_pipeline), exit::INTERNAL);
        assert_eq!(
            describe(&in_pipeline),
            "internal error (a bug, please report it): conversion task: task panicked",
            "the cause is printed once"
        );
        let invariant = ConvertError::internal("MoE layer 3 has no experts");
        let direct = anyhow::Error::from(invariant).context("convert");
        assert_eq!(exit_code(&direct), exit::INTERNAL);
        let input = anyhow::Error::from(HubError::InvalidInput {
            what: "glob",
            message: "x".into(),
        });
        assert_eq!(exit_code(&input), exit::FAILURE);
    }

    #[test]
    fn each_class_has_its_documented_exit_code() {
        assert_eq!(exit::class_code(ErrorClass::Failure), 1);
        assert_eq!(exit::class_code(ErrorClass::Locked), 3);
        assert_eq!(exit::class_code(ErrorClass::NoSpace), 5);
        assert_eq!(exit::class_code(ErrorClass::Verification), 6);
        assert_eq!(exit::class_code(ErrorClass::Internal), 7);
        let locked = anyhow::Error::from(PipelineError::Locked {
            lock: "d/.ftpipe/lock".into(),
            pid: "1".into(),
        });
        assert_eq!(exit_code(&locked), exit::LOCKED);
        let verify = anyhow::Error::from(VerifyFailed { problems: 2 }).context("verify");
        assert_eq!(exit_code(&verify), exit::VERIFY_FAILED);
        // A full disk in an error the libraries do not know.
        let full = std::io::Error::from(std::io::ErrorKind::StorageFull);
        let bare = anyhow::Error::from(full).context("write x");
        assert_eq!(exit_code(&bare), exit::NO_SPACE);
    }

    /// Regression: `Several` did not keep its inner error as `#[source]`,
    /// and the exit code looked at its first error only through a match
    /// that did not reach it, so two panicked fetch tasks exited 1 where one
    /// exited 7.
    #[test]
    fn two_panicked_fetch_tasks_exit_7_like_one() {
        let panicked = || FetchError::internal_from("fetch task", std::io::Error::other("panic"));
        let one = anyhow::Error::from(PipelineError::Fetch(panicked()));
        assert_eq!(exit_code(&one), exit::INTERNAL);
        let two = FetchError::several(2, vec![panicked(), panicked()]).expect("two errors");
        let two = anyhow::Error::from(PipelineError::Fetch(two));
        assert_eq!(exit_code(&two), exit::INTERNAL);
        assert_eq!(
            describe(&two),
            "2 of 2 files failed; the most severe: internal error (a bug, please report it): \
             fetch task: panic",
            "the cause is printed once"
        );
        // A full disk beside a network failure: the full disk decides.
        let stalled = FetchError::Stalled {
            path: "a".into(),
            received: 0,
            window_secs: 1.0,
            min_rate: 1,
        };
        let full = FetchError::io("write", "b.part", std::io::ErrorKind::StorageFull.into());
        let retried = FetchError::RetriesExhausted {
            path: "b".into(),
            attempts: 3,
            last: Box::new(full),
        };
        let mixed = FetchError::several(3, vec![stalled, retried]).expect("two errors");
        assert_eq!(exit_code(&anyhow::Error::from(mixed)), exit::NO_SPACE);
    }
}
