//! The commands that look and report without fetching or converting:
//! `status`, `audit`, `inspect`, `verify`.

use std::path::{Path, PathBuf};

use clap::Args;

use ftpipe_artifact::manifest::MANIFEST_FILE;
use ftpipe_hub::token::load_token;
use ftpipe_pipeline::Stage;
use ftpipe_progress::human;

use crate::{table, verify_view};

/// `ftpipe status`'s flags.
#[derive(Args)]
pub struct StatusArgs {
    /// DIR: the directory whose state is shown.
    #[arg(long)]
    pub out: PathBuf,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// `ftpipe audit`'s flags.
#[derive(Args)]
pub struct AuditArgs {
    /// DIR: the directory audited.
    #[arg(long)]
    pub out: PathBuf,
    /// Re-hash every source and component.
    #[arg(long)]
    pub deep: bool,
    /// Print the report as one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Also write a zstd-compressed evidence bundle (tar) to this file;
    /// it is refused if any entry holds the token (resolved as the
    /// fetching commands do, so `--token-file` here names the same file).
    #[arg(long, value_name = "FILE.tar.zst")]
    pub bundle: Option<PathBuf>,
    /// The token file the fetching commands were given, so the bundle
    /// guard knows that token too.
    #[arg(long, value_name = "FILE", requires = "bundle")]
    pub token_file: Option<PathBuf>,
}

/// `ftpipe inspect`'s flags.
#[derive(Args)]
pub struct InspectArgs {
    /// The file whose header is read.
    pub file: PathBuf,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// `ftpipe verify`'s flags.
#[derive(Args)]
pub struct VerifyArgs {
    /// The artifact directory (DIR/artifact, or a copy of it), or the
    /// DIR given as --out to the other commands (its artifact/ is checked).
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
    /// Also re-hash every component.
    #[arg(long)]
    pub deep: bool,
    /// Print the report as one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// The artifact `dir` names: `dir` itself when it holds a manifest or
/// holds no `artifact/` with one, else the `--out` DIR's `artifact/`.
fn artifact_dir(dir: &Path) -> PathBuf {
    let inner = ftpipe_pipeline::Layout::new(dir).artifact().to_owned();
    let holds_manifest = |d: &Path| d.join(MANIFEST_FILE).is_file();
    if !holds_manifest(dir) && holds_manifest(&inner) {
        inner
    } else {
        dir.to_owned()
    }
}

/// `verify` found problems (already listed on stdout).
#[derive(Debug)]
pub struct VerifyFailed {
    /// How many checks failed.
    pub problems: usize,
}

impl std::fmt::Display for VerifyFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "verification failed: {} problem(s)", self.problems)
    }
}

impl std::error::Error for VerifyFailed {}

/// `audit` found a run in progress in DIR (its report, a snapshot, is
/// already printed): exit code 3, as for any command meeting the lock.
#[derive(Debug)]
pub struct AuditInProgress {
    /// What holds the lock.
    pub live: ftpipe_pipeline::LiveRun,
}

impl std::fmt::Display for AuditInProgress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "a run is in progress (pid {} holds {}): the audit shows its unfinished work, not a \
             failure; audit again once it ends",
            self.live.pid,
            self.live.lock.display()
        )
    }
}

impl std::error::Error for AuditInProgress {}

/// Prints DIR's pin, stage states and byte counts.
pub async fn status(args: StatusArgs) -> anyhow::Result<bool> {
    let s = ftpipe_pipeline::status(&args.out).await?;
    if args.json {
        println!("{}", serde_json::to_string(&s)?);
    } else {
        print_status(&args.out, &s);
    }
    Ok(true)
}

fn print_status(out: &Path, s: &ftpipe_pipeline::StatusReport) {
    println!("{}", out.display());
    match &s.pin {
        Some(p) => println!("pin          {} {} -> {}", p.repo, p.revision, p.commit),
        None => println!("pin          none"),
    }
    // A pulled DIR is read, fetched and verified: it never plans or
    // converts, so those stages are not shown as pending.
    let pulled = s.pin.as_ref().is_some_and(ftpipe_pipeline::is_pull_pin);
    for (stage, state) in &s.stages {
        if pulled && matches!(stage, Stage::Plan | Stage::Convert) {
            continue;
        }
        println!("stage        {stage:<10} {state}");
    }
    println!(
        "files        {} selected, {} published, {} partial",
        s.files, s.published, s.partial
    );
    println!(
        "bytes        {} durable of {} expected",
        human::bytes(s.durable_bytes),
        human::bytes(s.expected_bytes),
    );
}

/// Prints the audit (and writes the bundle when asked); whether it is clean.
pub async fn audit(args: AuditArgs) -> anyhow::Result<bool> {
    if args.bundle.is_some() {
        // Resolving registers the token with the redaction point, which
        // the bundle guard scans for.
        load_token(args.token_file.as_deref())?;
        // The object-store credentials too (publish and pull hold them).
        ftpipe_objstore::register_credentials_from_env().await;
    }
    let (a, b) =
        ftpipe_pipeline::audit_with_bundle(&args.out, args.deep, args.bundle.as_deref()).await?;
    if args.json {
        println!("{}", serde_json::to_string(&a)?);
    } else {
        print!("{}", table::render(&a));
    }
    if let Some(b) = b {
        eprintln!(
            "evidence bundle: {} ({} entries, {})",
            b.path.display(),
            b.entries,
            human::bytes(b.bytes)
        );
    }
    if let Some(live) = a.live_run {
        return Err(AuditInProgress { live }.into());
    }
    Ok(a.ok)
}

/// Prints what a file's header says it holds.
pub fn inspect(args: &InspectArgs) -> anyhow::Result<bool> {
    let i = ftpipe_convert::inspect::inspect(&args.file)?;
    if args.json {
        println!("{}", serde_json::to_string(&i)?);
    } else {
        print!("{}", table::render_inspection(&i));
    }
    Ok(true)
}

/// Verifies an artifact directory on its own; a failure is [`VerifyFailed`].
pub fn verify(args: &VerifyArgs) -> anyhow::Result<bool> {
    let dir = artifact_dir(&args.dir);
    let layout = ftpipe_pipeline::Layout::new(&args.dir);
    if dir == args.dir && layout.state_dir().is_dir() && !dir.join(MANIFEST_FILE).is_file() {
        anyhow::bail!(
            "{} is a DIR of ftpipe with no artifact yet ({} has no {MANIFEST_FILE}): `ftpipe \
             convert --out DIR` or `ftpipe run` builds it",
            args.dir.display(),
            layout.artifact().display()
        );
    }
    let r =
        tokio::task::block_in_place(|| ftpipe_artifact::verify::verify_artifact(&dir, args.deep))?;
    if args.json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        print!("{}", verify_view::render(&r));
    }
    if !r.ok {
        return Err(VerifyFailed {
            problems: r.failures.len(),
        }
        .into());
    }
    Ok(true)
}
