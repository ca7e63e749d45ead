//! `ftpipe convert`, and the conversion choices it shares with `run`.

use std::path::PathBuf;

use clap::Args;
use clap::builder::RangedU64ValueParser;

use ftpipe_convert::ConvertOptions;
use ftpipe_pipeline::Pipeline;
use ftpipe_progress::human;

use super::args::{DEFAULT_CONVERT_JOBS, ProgressArgs, heading};
use super::summary::{Jobs, print_summary};
use crate::size;

/// Conversion choices shared by `convert` and `run`.
#[derive(Args)]
#[command(next_help_heading = heading::CONVERSION)]
pub struct ConvertTuning {
    /// Delete each source shard once every component reading it is durable.
    #[arg(long)]
    pub retire_sources: bool,
    /// Set a stale artifact aside (kept as evidence) and rebuild it.
    #[arg(long)]
    pub rebuild: bool,
    /// Also keep tensors matching this glob BF16 and mark them protected
    /// (repeatable; part of the converter identity).
    #[arg(long, value_name = "GLOB")]
    pub protect: Vec<String>,
    /// Convert with this declarative TOML recipe (glob → component, dtype
    /// policy) instead of a built-in profile.
    #[arg(long, value_name = "FILE.toml")]
    pub recipe: Option<PathBuf>,
    /// RAM budget for placing expert layers (e.g. 64GiB; default 0: all file tier).
    #[arg(long, default_value = "0", value_parser = size::parse_size)]
    pub ram_budget: u64,
    /// Part of the RAM budget kept free (e.g. 2GiB).
    #[arg(long, default_value = "0", value_parser = size::parse_size)]
    pub reserve: u64,
}

impl ConvertTuning {
    /// The conversion these choices ask for, `jobs` components at once.
    pub fn options(&self, jobs: usize, preflight: bool) -> anyhow::Result<ConvertOptions> {
        let recipe = match &self.recipe {
            Some(p) => Some(ftpipe_convert::load_recipe(p)?),
            None => None,
        };
        Ok(ConvertOptions {
            recipe,
            jobs: jobs.max(1),
            retire_sources: self.retire_sources,
            rebuild: self.rebuild,
            protect: self.protect.clone(),
            ram_budget: self.ram_budget,
            reserve: self.reserve,
            preflight,
        })
    }
}

/// `ftpipe convert`'s flags.
#[derive(Args)]
pub struct ConvertArgs {
    /// DIR: its sources (DIR/source) are converted into DIR/artifact.
    #[arg(long)]
    pub out: PathBuf,
    /// Components converted in parallel (1 to 64).
    #[arg(long, default_value_t = DEFAULT_CONVERT_JOBS, value_parser = RangedU64ValueParser::<usize>::new().range(1..=64))]
    pub jobs: usize,
    #[command(flatten)]
    pub tuning: ConvertTuning,
    /// Skip the free-space check before starting.
    #[arg(long)]
    pub no_preflight: bool,
    #[command(flatten)]
    pub progress: ProgressArgs,
}

/// Converts DIR/source into DIR/artifact.
pub async fn run(args: ConvertArgs) -> anyhow::Result<bool> {
    let opts = args.tuning.options(args.jobs, !args.no_preflight)?;
    let pipeline = Pipeline::open(&args.out, "convert").await?;
    let rep = args.progress.reporter();
    let outcome = pipeline.convert(&opts, rep.clone()).await;
    rep.finish();
    let outcome = outcome?;
    let jobs = Jobs {
        fetch: None,
        convert: Some(opts.jobs),
    };
    print_summary(args.progress, None, jobs, &outcome, || render(&outcome));
    Ok(true)
}

/// What a conversion did, one labelled line per fact.
pub fn render(o: &ftpipe_convert::ConvertOutcome) -> String {
    let mut out = String::new();
    if let Some(p) = &o.set_aside {
        out.push_str(&format!("stale artifact set aside as {}\n", p.display()));
    }
    out.push_str(&format!(
        "components       {} ({} written, {} reused)\n\
         bytes            {} (= predicted)\n\
         fingerprint      {}\n\
         manifest sha256  {}\n\
         placement        {} resident / {} file-tier expert layers, read queue depth {}\n",
        o.components,
        o.written,
        o.reused,
        human::bytes(o.total_bytes),
        o.fingerprint,
        o.manifest_sha256,
        o.placement.resident_layers.len(),
        o.placement.file_tier_layers.len(),
        o.placement.read_queue_depth
    ));
    if !o.retired.is_empty() {
        // The names: --json, or the log at FTPIPE_LOG=debug.
        tracing::debug!(retired = ?o.retired, "retired sources");
        out.push_str(&format!(
            "retired sources  {} files (deleted once converted; names with --json or FTPIPE_LOG=debug)\n",
            o.retired.len()
        ));
    }
    if o.omitted.0 > 0 {
        out.push_str(&format!(
            "omitted          {} source tensors, {} (vision, mtp; listed in manifest.json)\n",
            o.omitted.0,
            human::bytes(o.omitted.1)
        ));
    }
    if o.not_fetched.0 > 0 {
        out.push_str(&format!(
            "not fetched      {} omitted source tensors in files of {} left out by --exclude (listed in manifest.json, \"fetched\": false)\n",
            o.not_fetched.0,
            human::bytes(o.not_fetched.1)
        ));
    }
    out
}
