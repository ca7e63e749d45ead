//! The command line: the clap tree ([`Cli`], [`Command`]) and one module
//! per command or group of commands, each with its flags and its handler.
//!
//! - `args`: the argument groups several commands flatten (repo and
//!   origin, hub access, S3, transfer, resume, output), the one builder of
//!   `FetchOptions` from flags, value parsers.
//! - `fetch`: `fetch`; the one builder of `FetchParams` and the one place
//!   `--endpoint` is told apart (hub URL or s3:// mirror).
//! - `convert`: `convert`, and the conversion choices `run` shares.
//! - `run`: `run`, the whole chain.
//! - `plan`: `plan`.
//! - `publish`, `pull`, `mirror`: the object-store commands; `registry`:
//!   the flags, credentials and summary of `publish`/`pull` with `oci://`.
//! - `examine`: `status`, `audit`, `inspect`, `verify`.
//! - `summary`: the final JSON summary line or text of a command.
//! - `help`: the examples and environment of `--help` and the man pages.

pub mod args;
pub mod convert;
pub mod examine;
pub mod fetch;
pub mod help;
pub mod mirror;
pub mod plan;
pub mod publish;
pub mod pull;
pub mod registry;
pub mod run;
pub mod summary;

use std::path::PathBuf;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "ftpipe",
    version,
    about = "Resumable, verified acquisition of pinned model checkpoints"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Download a pinned repo into DIR/source with strict Range resume.
    Fetch(fetch::FetchArgs),
    /// Show the pin, stage states and byte counts of DIR.
    Status(examine::StatusArgs),
    /// Reconcile the byte ledger against receipts and files on disk.
    Audit(examine::AuditArgs),
    /// Predict every output component's exact size before converting.
    Plan(plan::PlanArgs),
    /// Convert DIR/source into the artifact in DIR/artifact (resumable).
    Convert(convert::ConvertArgs),
    /// resolve → plan → fetch → convert → verify, each a durable stage.
    Run(run::RunArgs),
    /// Upload DIR's verified artifact to s3://BUCKET/PREFIX: components
    /// (resumable multipart uploads), each checked, then manifest.json,
    /// create-only.
    Publish(publish::PublishArgs),
    /// Download the artifact published at s3://BUCKET/PREFIX into
    /// DIR/artifact with the fetch's resume and verification.
    Pull(pull::PullArgs),
    /// Mirror DIR's pinned, fully fetched sources to s3://BUCKET/PREFIX
    /// (files, then listing.json), for `--endpoint s3://BUCKET/PREFIX`.
    Mirror(mirror::MirrorArgs),
    /// Show what an FTW v1, FTEXPERT1 or safetensors file holds (header only).
    Inspect(examine::InspectArgs),
    /// Check an artifact directory on its own: no database, sources or network.
    Verify(examine::VerifyArgs),
    /// Serve a generated checkpoint locally, run the whole pipeline with a crash
    /// during download and one during conversion, resume, verify and audit.
    ///
    /// With --serve: only serve the checkpoint on loopback, until Ctrl-C,
    /// and print the commands that fetch, run, publish and pull it.
    Demo {
        /// Where to leave the result (default: a new temp dir); with
        /// --serve, where the printed commands put theirs.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Keep the checkpoint served on loopback until Ctrl-C (nothing is
        /// run): try the commands it prints from another shell.
        #[arg(long)]
        serve: bool,
    },
    /// Print the completion script of a shell.
    ///
    /// E.g. `ftpipe completions bash >
    /// ~/.local/share/bash-completion/completions/ftpipe`.
    Completions {
        /// The shell to complete for.
        shell: clap_complete::Shell,
    },
    /// Print the man page of ftpipe or of one command, or write them all.
    ///
    /// `ftpipe man fetch | man -l -` shows one page; `ftpipe man --dir DIR`
    /// writes ftpipe.1 and ftpipe-COMMAND.1 for every command.
    Man {
        /// The command whose page to print (default: ftpipe's own page).
        #[arg(value_name = "COMMAND", conflicts_with = "dir")]
        command: Option<String>,
        /// Write ftpipe.1 and ftpipe-COMMAND.1 for every command into DIR.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
}

/// ftpipe's clap tree as `--help`, the man pages and the completions show
/// it: [`Cli`]'s, with each command's examples and environment.
pub fn command() -> clap::Command {
    help::decorate(Cli::command())
}

impl Cli {
    /// Parses the process's arguments against [`command`] (exits with
    /// clap's message and code 2 on a bad command line, 0 for `--help`).
    pub fn parse_args() -> Cli {
        let matches = command().get_matches();
        Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
    }
}

impl Command {
    /// Whether the command was asked for JSON output (`--json`).
    pub fn json(&self) -> bool {
        match self {
            Command::Fetch(a) => a.progress.json,
            Command::Run(a) => a.fetch.progress.json,
            Command::Convert(a) => a.progress.json,
            Command::Pull(a) => a.progress.json,
            Command::Publish(a) => a.upload.json,
            Command::Mirror(a) => a.upload.json,
            Command::Plan(a) => a.json,
            Command::Status(a) => a.json,
            Command::Audit(a) => a.json,
            Command::Inspect(a) => a.json,
            Command::Verify(a) => a.json,
            Command::Demo { .. } | Command::Completions { .. } | Command::Man { .. } => false,
        }
    }

    /// Components this command converts at once (0: it converts nothing).
    pub fn parallel_conversions(&self) -> usize {
        match self {
            Command::Convert(args) => args.jobs,
            Command::Run(args) => args.convert_jobs(),
            Command::Demo { .. } => crate::demo::CONVERT_JOBS,
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    fn command(args: &[&str]) -> Command {
        Cli::try_parse_from(args)
            .expect("valid command line")
            .command
    }

    #[test]
    fn run_and_convert_count_their_parallel_conversions() {
        let fetch = command(&["ftpipe", "fetch", "a/b", "--out", "d", "--jobs", "64"]);
        assert_eq!(fetch.parallel_conversions(), 0);
        let convert = command(&["ftpipe", "convert", "--out", "d", "--jobs", "64"]);
        assert_eq!(convert.parallel_conversions(), 64);
        let run = command(&["ftpipe", "run", "a/b", "--out", "d", "--jobs", "3"]);
        assert_eq!(run.parallel_conversions(), 3);
        let run = command(&["ftpipe", "run", "a/b", "--out", "d", "--convert-jobs", "5"]);
        assert_eq!(run.parallel_conversions(), 5);
    }

    /// `mirror REPO` fetches with the library's defaults: they must be
    /// what `fetch` without flags asks for.
    #[test]
    fn fetch_without_flags_asks_for_the_library_defaults() {
        let Command::Fetch(args) = command(&["ftpipe", "fetch", "a/b", "--out", "d"]) else {
            panic!("not fetch");
        };
        let options = args::fetch_options(
            args::DEFAULT_FETCH_JOBS,
            &args.transfer,
            &args.resume,
            Some(&args.timing),
            !args.no_preflight,
        )
        .expect("fetch options");
        let defaults = ftpipe_fetch::FetchOptions {
            jobs: args::DEFAULT_FETCH_JOBS,
            ..ftpipe_fetch::FetchOptions::default()
        };
        assert_eq!(format!("{options:?}"), format!("{defaults:?}"));
        assert_eq!(
            args.hub.stall.read_timeout,
            args::DEFAULT_READ_TIMEOUT_SECS,
            "mirror's HubArgs::for_repo"
        );
    }

    /// Every argument of every command (the help and version flags
    /// aside) says what it is for: `--out` and `--revision` once had an
    /// empty help line.
    #[test]
    fn every_argument_of_every_command_has_help() {
        let mut root = crate::cli::command();
        root.build();
        let mut checked = 0;
        for cmd in std::iter::once(&root).chain(root.get_subcommands()) {
            for arg in cmd.get_arguments() {
                let id = arg.get_id().as_str();
                if id == "help" || id == "version" {
                    continue;
                }
                let help = arg
                    .get_long_help()
                    .or(arg.get_help())
                    .map(ToString::to_string);
                assert!(
                    help.is_some_and(|h| !h.trim().is_empty()),
                    "`ftpipe {}` argument {id} has no help",
                    cmd.get_name()
                );
                checked += 1;
            }
        }
        assert!(checked > 100, "only {checked} arguments walked");
    }

    /// `--help` of ftpipe and of every command ends with examples and the
    /// environment it reads; the hub commands list the hub's variables,
    /// the object-storage ones AWS's.
    #[test]
    fn every_help_has_examples_and_environment() {
        let mut root = crate::cli::command();
        root.build();
        for cmd in std::iter::once(&root).chain(root.get_subcommands()) {
            if cmd.get_name() == "help" {
                continue;
            }
            let after = cmd
                .get_after_long_help()
                .map(ToString::to_string)
                .unwrap_or_default();
            assert!(
                after.contains("Examples:\n  $ ftpipe") && after.contains("\nEnvironment:\n  "),
                "`ftpipe {}`: {after}",
                cmd.get_name()
            );
            assert!(after.contains("FTPIPE_LOG"), "{after}");
            let name = cmd.get_name();
            if ["fetch", "run", "plan", "mirror", "ftpipe"].contains(&name) {
                assert!(
                    after.contains("HF_TOKEN") && after.contains("HF_ENDPOINT"),
                    "{after}"
                );
            }
            if ["publish", "pull", "mirror", "ftpipe"].contains(&name) {
                assert!(after.contains("AWS_ACCESS_KEY_ID"), "{after}");
            }
        }
    }

    /// `run`'s ~45 options come under headings, a handful left in the
    /// general list.
    #[test]
    fn run_groups_its_options_under_headings() {
        let mut root = crate::cli::command();
        root.build();
        let run = root.find_subcommand("run").expect("run");
        let options: Vec<&clap::Arg> = run
            .get_arguments()
            .filter(|a| a.get_long().is_some())
            .collect();
        let headings: std::collections::BTreeSet<&str> = options
            .iter()
            .filter_map(|a| a.get_help_heading())
            .collect();
        assert!(headings.len() >= 6, "{headings:?}");
        let plain: Vec<&str> = options
            .iter()
            .filter(|a| a.get_help_heading().is_none())
            .filter_map(|a| a.get_long())
            .collect();
        assert!(plain.len() <= 4, "options without a heading: {plain:?}");
    }

    /// `pull` keeps its own help and default where it differs from `fetch`.
    #[test]
    fn pull_says_objects_and_splits_at_any_rate() {
        let Command::Pull(args) = command(&["ftpipe", "pull", "s3://b/p", "--out", "d"]) else {
            panic!("not pull");
        };
        assert_eq!(args.transfer.split_below_rate, 0);
        let Command::Fetch(args) = command(&["ftpipe", "fetch", "a/b", "--out", "d"]) else {
            panic!("not fetch");
        };
        assert_eq!(args.transfer.split_below_rate, 128 << 20);
    }
}
