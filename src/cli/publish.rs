//! `ftpipe publish`: DIR's verified artifact to s3://BUCKET/PREFIX, or to
//! an OCI registry as a ModelPack artifact (oci://REGISTRY/REPOSITORY:TAG).

use std::path::{Path, PathBuf};

use anyhow::bail;
use clap::Args;

use ftpipe_artifact::manifest::MANIFEST_FILE;
use ftpipe_pipeline::{Layout, Pipeline};

use super::args::{S3Args, UploadArgs, heading};
use super::registry::{RegistryArgs, RegistrySession, print_registry_summary};
use super::summary::{S3Session, print_s3_summary, upload_counts};
use ftpipe_progress::human;

/// `ftpipe publish`'s flags.
#[derive(Args)]
pub struct PublishArgs {
    /// The directory whose verified artifact (DIR/artifact) is published.
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
    /// Where: s3://BUCKET/PREFIX, or oci://REGISTRY/REPOSITORY[:TAG] (a
    /// CNCF ModelPack artifact; tag `latest` when none is given).
    #[arg(value_name = "DEST")]
    pub dest: String,
    #[command(flatten)]
    pub s3: S3Args,
    #[command(flatten)]
    pub registry: RegistryArgs,
    /// Move the tag of an oci:// destination when it names another
    /// artifact (refused otherwise).
    #[arg(long, help_heading = heading::REGISTRY)]
    pub force_tag: bool,
    /// Mount blobs the oci:// destination lacks from this repository of
    /// the same registry (a cross-repository mount: nothing is sent for a
    /// blob the registry links; one it does not is uploaded).
    #[arg(long, value_name = "REPOSITORY", help_heading = heading::REGISTRY)]
    pub mount_from: Option<String>,
    #[command(flatten)]
    pub upload: UploadArgs,
}

/// The DIR whose artifact is published: `dir`, or the DIR around it when
/// `dir` is that DIR's `artifact/` (DIR holds the receipts publish
/// checks). Anything else without an `artifact/` is refused before DIR's
/// state is created, saying which directory publish wants.
fn published_dir(dir: &Path) -> anyhow::Result<PathBuf> {
    let artifact = Layout::new(dir).artifact().to_owned();
    if artifact.is_dir() {
        return Ok(dir.to_owned());
    }
    if !dir.join(MANIFEST_FILE).is_file() {
        bail!(
            "{} does not exist: nothing to publish (`ftpipe run` or `ftpipe convert` makes it)",
            artifact.display()
        );
    }
    let around = dir.parent().map(|p| {
        if p.as_os_str().is_empty() {
            Path::new(".")
        } else {
            p
        }
    });
    if let Some(around) = around
        && Layout::new(around).artifact().file_name() == dir.file_name()
        && Layout::new(around).state_dir().is_dir()
    {
        return Ok(around.to_owned());
    }
    bail!(
        "{} is an artifact, not a DIR that holds one: publish takes the DIR `run` or `convert` \
         was given as --out (its artifact/ and the receipts in its .ftpipe/); did you mean the \
         directory that held this artifact when it was built?",
        dir.display()
    )
}

/// Publishes DIR/artifact.
pub async fn run(args: PublishArgs) -> anyhow::Result<bool> {
    if args.dest.starts_with(ftpipe_objstore::OCI_SCHEME) {
        return run_oci(args).await;
    }
    let location = ftpipe_objstore::S3Location::parse(&args.dest)?;
    args.upload.check()?;
    // Nothing to publish is no reason to create DIR's state.
    let dir = published_dir(&args.dir)?;
    let config = args.s3.config(args.upload.stall).await?;
    let session = S3Session::of(&config);
    let pipeline = Pipeline::open(&dir, "publish").await?;
    let outcome = pipeline
        .publish(&ftpipe_pipeline::PublishParams {
            location,
            config,
            part_size: args.upload.part_size,
            concurrency: args.upload.concurrency,
        })
        .await?;
    print_s3_summary(
        args.upload.json,
        args.upload.quiet,
        &session,
        &outcome,
        || {
            format!(
                "{}
fingerprint      {}
manifest sha256  {}
objects          {}
bytes sent       {}
",
                if outcome.already_published {
                    format!("already published at {}", outcome.dest)
                } else {
                    format!("published at {}", outcome.dest)
                },
                outcome.fingerprint,
                outcome.manifest_sha256,
                upload_counts(outcome.objects, outcome.uploaded),
                human::bytes(outcome.bytes_sent)
            )
        },
    );
    Ok(true)
}

/// Publishes DIR/artifact to a registry as a ModelPack artifact.
async fn run_oci(args: PublishArgs) -> anyhow::Result<bool> {
    let reference = ftpipe_objstore::OciReference::parse(&args.dest)?;
    args.upload.check()?;
    let dir = published_dir(&args.dir)?;
    let config = args.registry.config(&reference, args.upload.stall).await?;
    let mount_from = args
        .mount_from
        .as_deref()
        .map(ftpipe_objstore::RepositoryName::parse)
        .transpose()?;
    let session = RegistrySession::of(&reference, &config);
    let pipeline = Pipeline::open(&dir, "publish").await?;
    let outcome = pipeline
        .publish_oci(&ftpipe_pipeline::OciPublishParams {
            reference,
            config,
            part_size: args.upload.part_size,
            force_tag: args.force_tag,
            mount_from,
        })
        .await?;
    let (json, quiet) = (args.upload.json, args.upload.quiet);
    print_registry_summary(json, quiet, &session, &outcome, || {
        format!(
            "{} {}
manifest digest  {}
fingerprint      {}
manifest sha256  {}
blobs            {}
bytes sent       {}
{}",
            if outcome.already_published {
                "already published at"
            } else {
                "published at"
            },
            outcome.dest,
            outcome.manifest_digest,
            outcome.fingerprint,
            outcome.manifest_sha256,
            upload_counts(outcome.objects, outcome.uploaded),
            human::bytes(outcome.bytes_sent),
            mounted_line(outcome.mounted, outcome.mounted_bytes)
        )
    });
    Ok(true)
}

/// `mounted N blobs, B` when a cross-repository mount linked any.
fn mounted_line(mounted: usize, bytes: u64) -> String {
    if mounted == 0 {
        return String::new();
    }
    let s = if mounted == 1 { "" } else { "s" };
    format!(
        "mounted          {mounted} blob{s}, {} (nothing sent)\n",
        human::bytes(bytes)
    )
}
