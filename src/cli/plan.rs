//! `ftpipe plan`: every output component's exact size before converting,
//! from DIR/source or (`--remote`) from the headers on the hub or mirror.

use std::path::PathBuf;

use clap::Args;

use ftpipe_artifact::manifest::Partition;
use ftpipe_hub::token::load_token;
use ftpipe_pipeline::PlanSource;

use super::args::{HubArgs, heading};
use super::fetch::{mirror_of_endpoint, offline_env};
use crate::size;
use ftpipe_progress::human;

/// `ftpipe plan`'s flags.
#[derive(Args)]
pub struct PlanArgs {
    #[command(flatten)]
    pub hub: HubArgs,
    /// Read only the safetensors headers from the hub (HTTP Range), no weights.
    /// Without it, plan from the sources in DIR/source/.
    #[arg(long, help_heading = heading::HUB)]
    pub remote: bool,
    /// Print one JSON object.
    #[arg(long, help_heading = heading::OUTPUT)]
    pub json: bool,
    /// Plan with this declarative TOML recipe instead of a built-in profile.
    #[arg(long, value_name = "FILE.toml", help_heading = heading::CONVERSION)]
    pub recipe: Option<PathBuf>,
    /// Plan for a fetch of only the files matching these globs (default:
    /// the selection DIR was pinned with).
    #[arg(long, help_heading = heading::SELECTION)]
    pub include: Vec<String>,
    /// Plan for a fetch that skips the files matching these globs.
    #[arg(long, help_heading = heading::SELECTION)]
    pub exclude: Vec<String>,
    /// Also schedule fetch, conversion and retirement so that the source
    /// bytes on disk never exceed SIZE (e.g. 380GB = 380·10^9 bytes,
    /// 100GiB = 100·2^30): prints the predicted peak disk against an
    /// unbudgeted run, and the minimum feasible budget (a smaller SIZE is
    /// refused, naming it).
    #[arg(long, value_name = "SIZE", value_parser = size::parse_size, help_heading = heading::CONVERSION)]
    pub disk_budget: Option<u64>,
    /// With --remote on a DIR holding an artifact: plan the revision's
    /// current commit and say what `run --repin` will fetch and which
    /// components it keeps, checks after the fetch, or converts again.
    #[arg(long, requires = "remote", help_heading = heading::HUB)]
    pub repin: bool,
}

/// Where the plan reads headers: the mirror `--endpoint` names, the hub
/// (`--remote`), or DIR/source.
async fn plan_source(args: &PlanArgs) -> anyhow::Result<PlanSource> {
    let hub = &args.hub;
    if !args.remote {
        return Ok(PlanSource::Local);
    }
    Ok(match mirror_of_endpoint(hub).await? {
        Some(m) => PlanSource::Mirror(m),
        None => PlanSource::Remote {
            endpoint: hub.origin.endpoint.clone(),
            token: load_token(hub.token_file.as_deref())?.0,
            read_timeout: hub.stall.duration()?,
            offline: hub.offline || offline_env(),
        },
    })
}

/// Plans the conversion (remote: headers over HTTP Range at the pinned or
/// freshly resolved commit; local: DIR/source) and prints it.
pub async fn run(args: PlanArgs) -> anyhow::Result<bool> {
    let source = plan_source(&args).await?;
    let opts = ftpipe_convert::PlanOptions {
        protect: Vec::new(),
        recipe: match &args.recipe {
            Some(p) => Some(ftpipe_convert::load_recipe(p)?),
            None => None,
        },
        selection: ftpipe_hub::resolve::FetchSelection::default(),
    };
    let globs = ftpipe_pipeline::SelectionGlobs {
        include: args.include.clone(),
        exclude: args.exclude.clone(),
    };
    let report = ftpipe_pipeline::plan(
        &args.hub.out,
        &args.hub.repo,
        &args.hub.origin.revision,
        source,
        &globs,
        &opts,
        args.disk_budget,
        args.repin,
    )
    .await?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", render_plan(&report.plan));
        if let Some(b) = &report.disk_budget {
            print!("{}", render_budget(b));
        }
        match &report.repin {
            Some(r) => print!("{}", render_repin(r)),
            None if args.repin => {
                println!(
                    "repin: DIR holds no artifact converted from another commit; nothing to compare"
                );
            }
            None => {}
        }
    }
    Ok(true)
}

/// The plan as a fixed-width table: one line per component, then the total.
fn render_plan(plan: &ftpipe_convert::Plan) -> String {
    let mut out = format!(
        "profile {} (model_type {}), {} source files, {}\n",
        plan.profile,
        plan.model_type,
        plan.sources.len(),
        human::bytes(plan.source_bytes)
    );
    out.push_str(&format!(
        "{:<40} {:<16} {:>10} {:>16}\n",
        "component", "kind", "items", "size"
    ));
    for c in &plan.components {
        out.push_str(&format!(
            "{:<40} {:<16} {:>10} {:>16}\n",
            c.name,
            c.kind.as_str(),
            c.items,
            human::bytes(c.predicted_bytes)
        ));
    }
    out.push_str(&format!(
        "{:<40} {:<16} {:>10} {:>16} ({} bytes; exact sizes: --json)\n",
        "total",
        "",
        plan.components.len(),
        human::bytes(plan.total_bytes),
        plan.total_bytes
    ));
    let count = |p: Partition, fetched: bool| {
        plan.omitted
            .iter()
            .filter(|o| o.reason == p && o.fetched == fetched)
            .count()
    };
    let (n, bytes) = plan.omitted_totals();
    if n > 0 {
        out.push_str(&format!(
            "omitted: {n} source tensors, {}, not part of the text artifact (vision {}, mtp {}); still fetched and verified\n",
            human::bytes(bytes),
            count(Partition::Vision, true),
            count(Partition::Mtp, true)
        ));
    }
    let (n, bytes) = plan.not_fetched_totals();
    if n > 0 {
        out.push_str(&format!(
            "not fetched: {n} omitted source tensors (vision {}, mtp {}) in {} files of {} left out of the fetch:\n",
            count(Partition::Vision, false),
            count(Partition::Mtp, false),
            plan.excluded_sources.len(),
            human::bytes(bytes)
        ));
        for s in &plan.excluded_sources {
            out.push_str(&format!(
                "  {} ({} tensors, {}; {})\n",
                s.file,
                s.tensors,
                human::bytes(s.bytes),
                s.by
            ));
        }
    }
    out
}

/// What `run --repin` will do: the files it fetches, then each component
/// it does not keep.
fn render_repin(r: &ftpipe_pipeline::RepinReport) -> String {
    use ftpipe_convert::rebuild::Fate;
    let mut out = format!(
        "repin {} -> {}: fetches {} files ({}, {} bytes)\n",
        r.from_commit,
        r.to_commit,
        r.fetch_files.len(),
        human::bytes(r.fetch_bytes),
        r.fetch_bytes
    );
    for f in &r.fetch_files {
        out.push_str(&format!("  fetch {f}\n"));
    }
    if r.xet_fetch_bytes > 0 {
        out.push_str(&format!(
            "  {} ({} bytes) of them in Xet storage: their chunks the old files hold are read back and checked, not fetched\n",
            human::bytes(r.xet_fetch_bytes),
            r.xet_fetch_bytes
        ));
    }
    for (fate, what) in [
        (Fate::Kept, "kept (identity unchanged)"),
        (
            Fate::Checked,
            "read changed files: kept if the bytes of their spans are unchanged, else converted again",
        ),
        (Fate::Rebuilt, "converted again"),
    ] {
        let (n, bytes) = r.rebuild.totals(fate);
        out.push_str(&format!(
            "{n} components, {}: {what}\n",
            human::bytes(bytes)
        ));
        if fate != Fate::Kept {
            for c in r.rebuild.with(fate) {
                match c.changed_files.as_slice() {
                    [] => out.push_str(&format!("  {}\n", c.component)),
                    files => out.push_str(&format!("  {} ({})\n", c.component, files.join(", "))),
                }
            }
        }
    }
    out
}

/// The schedule under `--disk-budget`: predicted peak against today's,
/// and the minimum feasible budget (computed from spans when the volume
/// can punch holes).
fn render_budget(b: &ftpipe_convert::schedule::BudgetReport) -> String {
    use ftpipe_convert::schedule::{ReleaseKind, shown};
    let held = match b.release {
        ReleaseKind::Spans => format!(
            "each kept down to its header and PLE spans ({} in all, in units of {} bytes) once converted, until the Q3 table is written",
            shown(b.ple_kept_bytes),
            b.allocation_unit
        ),
        ReleaseKind::CopyAside => format!(
            "each released once converted, its PLE spans copied aside ({} in all; this volume cannot punch holes) until the Q3 table is written",
            shown(b.ple_kept_bytes)
        ),
        ReleaseKind::WholeFiles => "held whole until the Q3 table is written".to_owned(),
    };
    format!(
        "disk budget      {} ({} bytes); minimum feasible {} ({} bytes), from {}\n\
         predicted peak   {} ({} bytes) of sources held + artifact written, {} of it sources\n\
         unbudgeted peak  {} ({} bytes): every source and the whole artifact\n\
         peak ratio       {:.3} (budgeted / unbudgeted)\n\
         schedule         {} PLE file(s) of {} first, {held}; \
         every other file retired once converted (largest {})\n",
        shown(b.budget),
        b.budget,
        shown(b.minimum_budget),
        b.minimum_budget,
        match b.release {
            ReleaseKind::Spans => "spans",
            ReleaseKind::CopyAside => "spans copied aside",
            ReleaseKind::WholeFiles => "whole files",
        },
        shown(b.predicted_peak),
        b.predicted_peak,
        shown(b.predicted_peak_sources),
        shown(b.unbudgeted_peak),
        b.unbudgeted_peak,
        b.peak_ratio,
        b.ple_files,
        shown(b.ple_bytes),
        shown(b.largest_other_bytes),
    )
}
