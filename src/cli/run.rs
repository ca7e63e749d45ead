//! `ftpipe run`: resolve → plan → fetch → convert → verify, each a durable
//! stage, with `fetch`'s flags and `convert`'s choices.

use clap::Args;
use clap::builder::RangedU64ValueParser;

use ftpipe_pipeline::Pipeline;

use super::args::{DEFAULT_CONVERT_JOBS, DEFAULT_FETCH_JOBS, heading};
use super::convert::{self, ConvertTuning};
use super::fetch::FetchArgs;
use super::summary::{Jobs, print_summary};
use crate::size;

/// `ftpipe run`'s flags: `fetch`'s, then the conversion's.
#[derive(Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub fetch: FetchArgs,
    /// Files the fetch stage transfers in parallel (1 to 64; default
    /// --jobs, else 4, as `fetch`).
    #[arg(long, value_parser = RangedU64ValueParser::<usize>::new().range(1..=64), help_heading = heading::TRANSFER)]
    pub fetch_jobs: Option<usize>,
    /// Components the convert stage converts in parallel (1 to 64; default
    /// --jobs, else 2, as `convert`).
    #[arg(long, value_parser = RangedU64ValueParser::<usize>::new().range(1..=64), help_heading = heading::CONVERSION)]
    pub convert_jobs: Option<usize>,
    #[command(flatten)]
    pub tuning: ConvertTuning,
    /// Build while downloading so that the source bytes on disk (config,
    /// index, every shard admitted and not yet deleted, a `.part` counted
    /// whole) never exceed SIZE (e.g. 120GB = 120·10^9 bytes, 100GiB =
    /// 100·2^30): each shard is converted as soon as it is verified and
    /// deleted once nothing unfinished needs it. A SIZE below the minimum
    /// `plan --remote --disk-budget` reports is refused before any shard
    /// is fetched.
    #[arg(long, value_name = "SIZE", value_parser = size::parse_size, conflicts_with = "reacquire", help_heading = heading::CONVERSION)]
    pub disk_budget: Option<u64>,
}

impl RunArgs {
    /// `--fetch-jobs`, else `--jobs`, else the default of `fetch`.
    pub fn fetch_jobs(&self) -> usize {
        self.fetch_jobs
            .or(self.fetch.jobs)
            .unwrap_or(DEFAULT_FETCH_JOBS)
    }

    /// `--convert-jobs`, else `--jobs`, else the default of `convert`.
    pub fn convert_jobs(&self) -> usize {
        self.convert_jobs
            .or(self.fetch.jobs)
            .unwrap_or(DEFAULT_CONVERT_JOBS)
    }
}

/// The whole chain; a finished run is a no-op that says so.
pub async fn run(args: RunArgs) -> anyhow::Result<bool> {
    let (params, session) = args.fetch.params(args.fetch_jobs()).await?;
    let opts = args
        .tuning
        .options(args.convert_jobs(), !args.fetch.no_preflight)?;
    let jobs = Jobs {
        fetch: Some(params.options.jobs),
        convert: Some(opts.jobs),
    };
    let progress = args.fetch.progress;
    let pipeline = Pipeline::open(&args.fetch.hub.out, "run").await?;
    let rep = progress.reporter();
    let outcome = pipeline
        .run(params, opts, args.disk_budget, rep.clone())
        .await;
    rep.finish();
    let outcome = outcome?;
    print_summary(
        progress,
        Some(&session),
        jobs,
        &outcome,
        || match &outcome.convert {
            Some(c) => convert::render(c),
            None => format!(
                "{}\nmanifest sha256  {}\n",
                outcome.summary, outcome.manifest_sha256
            ),
        },
    );
    Ok(true)
}
