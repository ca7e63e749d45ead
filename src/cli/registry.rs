//! `publish` to and `pull` from an OCI registry (`oci://`): the flags only
//! a registry has, the credentials the container way, and the summary.

use clap::Args;

use ftpipe_objstore::{OciReference, RegistryConfig, registry_credentials};

use super::args::{StallArgs, heading};

/// How to reach a registry (`publish` and `pull` to or from `oci://`).
#[derive(Args)]
#[command(next_help_heading = heading::REGISTRY)]
pub struct RegistryArgs {
    /// Speak plain http to the registry of an oci:// reference (a loopback
    /// or test registry; a warning for any other host). Credentials come
    /// from REGISTRY_AUTH_FILE, $XDG_RUNTIME_DIR/containers/auth.json or
    /// ~/.docker/config.json (`credHelpers`, `auths`, `credsStore`: a
    /// docker-credential-NAME helper on PATH, given --read-timeout); a
    /// registry's Bearer challenge is answered with a token from its realm,
    /// which must be on the registry's host.
    #[arg(long)]
    pub plain_http: bool,
}

impl RegistryArgs {
    /// The configuration for `reference`'s registry: its credentials (the
    /// first auth file holding an entry for it), `stall`'s read timeout.
    pub async fn config(
        &self,
        reference: &OciReference,
        stall: StallArgs,
    ) -> anyhow::Result<RegistryConfig> {
        if self.plain_http && !reference.is_loopback() {
            eprintln!(
                "warning: --plain-http to {}: requests and credentials cross the network unencrypted",
                reference.registry
            );
        }
        let read_timeout = stall.duration()?;
        let lookup = registry_credentials(&reference.registry, read_timeout).await?;
        for problem in &lookup.unreadable {
            eprintln!("warning: auth file {problem}; going on without its credentials");
        }
        Ok(RegistryConfig {
            plain_http: self.plain_http,
            read_timeout,
            credentials: lookup.credentials,
            unreadable_auth: lookup.unreadable,
        })
    }
}

/// What a registry command reports beside its outcome (never a
/// credential).
#[derive(Debug, Clone, serde::Serialize)]
pub struct RegistrySession {
    registry: String,
    plain_http: bool,
    credentials_from: Option<String>,
}

impl RegistrySession {
    /// What of `c` may be shown.
    pub fn of(reference: &OciReference, c: &RegistryConfig) -> RegistrySession {
        RegistrySession {
            registry: reference.registry.clone(),
            plain_http: c.plain_http,
            credentials_from: c.credentials.as_ref().map(|c| c.from.to_string()),
        }
    }
}

/// Prints a registry command's JSON summary, or `text()`.
pub fn print_registry_summary<T: serde::Serialize>(
    json: bool,
    quiet: bool,
    session: &RegistrySession,
    outcome: &T,
    text: impl FnOnce() -> String,
) {
    if json {
        let v = serde_json::json!({ "event": "summary", "outcome": outcome, "session": session });
        println!("{v}");
    } else if !quiet {
        print!("{}", text());
    }
}
