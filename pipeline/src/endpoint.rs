//! The one reading of `--endpoint` ([`Endpoint::parse`]: `s3://` names a
//! mirror, anything else must be a hub URL) and the one place the origin
//! the command line names is built (`open_origin`).

use std::sync::Arc;
use std::time::Duration;

use ftpipe_hub::client::{HubClient, Token};
use ftpipe_hub::hfcache::HfCache;
use ftpipe_objstore::S3Location;

use crate::error::Result;
use crate::mirror::{Mirror, MirrorParams};
use crate::origin::{HubOrigin, Origin};

/// What `--endpoint` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// A hub's URL (checked).
    Hub(String),
    /// A mirror in object storage, `s3://BUCKET/PREFIX`.
    Mirror(S3Location),
}

impl Endpoint {
    /// The one reading of `--endpoint`: `s3://BUCKET/PREFIX` is a mirror,
    /// anything else must be a hub URL.
    pub fn parse(endpoint: &str) -> Result<Endpoint> {
        if endpoint.starts_with("s3://") {
            return Ok(Endpoint::Mirror(S3Location::parse(endpoint)?));
        }
        ftpipe_hub::client::parse_endpoint(endpoint)?;
        Ok(Endpoint::Hub(endpoint.to_owned()))
    }
}

/// The one place an origin is built: the mirror when one is given, else
/// the hub at `endpoint` (refusing every request when `offline`, taking
/// files from `hf_cache` first, and Xet files from Xet storage when `xet`).
pub(crate) fn open_origin(
    mirror: Option<&MirrorParams>,
    endpoint: &str,
    token: Option<Token>,
    read_timeout: Duration,
    hf_cache: Option<HfCache>,
    offline: bool,
    xet: bool,
) -> Result<Arc<dyn Origin>> {
    if let Some(m) = mirror {
        return Ok(Arc::new(Mirror::open(m)?));
    }
    let client = HubClient::new(endpoint, token, read_timeout)?;
    let client = if offline {
        client.into_offline()
    } else {
        client
    };
    Ok(Arc::new(HubOrigin {
        client,
        hf_cache,
        offline,
        xet,
        read_timeout,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_endpoint_is_a_mirror_by_its_scheme_and_a_hub_url_otherwise() {
        assert!(matches!(
            Endpoint::parse("s3://models/mirror"),
            Ok(Endpoint::Mirror(_))
        ));
        assert_eq!(
            Endpoint::parse("http://127.0.0.1:9").ok(),
            Some(Endpoint::Hub("http://127.0.0.1:9".into()))
        );
        assert!(Endpoint::parse("s3://").is_err());
        assert!(Endpoint::parse("not a url").is_err());
    }
}
