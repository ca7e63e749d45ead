//! Why an object-storage request or its setup failed. Every message names
//! the object key (or the location, endpoint or file) and what was
//! expected; none carries a credential (they are registered with the
//! redaction point, and no variant holds one).

use ftpipe_fs::ErrorClass;

/// A `Result` with [`ObjStoreError`].
pub type Result<T, E = ObjStoreError> = std::result::Result<T, E>;

/// An object-storage failure.
#[derive(Debug, thiserror::Error)]
pub enum ObjStoreError {
    /// The `s3://BUCKET/PREFIX` argument is malformed.
    #[error("{given:?} is not an S3 location: {reason} (expected s3://BUCKET/PREFIX)")]
    BadLocation {
        /// What was given.
        given: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The endpoint URL is malformed or not allowed.
    #[error("S3 endpoint {endpoint:?}: {reason}")]
    BadEndpoint {
        /// The endpoint, without any userinfo.
        endpoint: String,
        /// What is wrong with it.
        reason: String,
    },
    /// No credentials could be found, or a credentials file is malformed.
    #[error("S3 credentials: {reason}")]
    Credentials {
        /// What is missing or wrong (never a value).
        reason: String,
    },
    /// No source of the AWS default chain had credentials.
    #[error("S3 credentials: none found; tried, in order: {}", tried.join("; "))]
    NoCredentials {
        /// Each source of the chain and what of it is set.
        tried: Vec<String>,
    },
    /// The client could not be built from the configuration.
    #[error("S3 client for bucket {bucket}: {source}")]
    Client {
        /// The bucket.
        bucket: String,
        /// Why.
        #[source]
        source: object_store::Error,
    },
    /// A request failed (network, server error, refused credentials).
    #[error("S3 {op} of {key}: {source}")]
    Request {
        /// What was asked (`get`, `head`, `put`, `upload part`, ...).
        op: &'static str,
        /// The object key, `s3://BUCKET/KEY`.
        key: String,
        /// Why.
        #[source]
        source: object_store::Error,
    },
    /// A request made with the client of its own (the checksum HEAD)
    /// failed before an answer (network, timeout); the URL is left out (it
    /// holds the signature).
    #[error("S3 {op} of {key}: {source}")]
    Http {
        /// What was asked.
        op: &'static str,
        /// The object key, `s3://BUCKET/KEY`.
        key: String,
        /// Why.
        #[source]
        source: reqwest::Error,
    },
    /// A request made with the client of its own (a HEAD: no error
    /// document to read) was refused: what its status says to fix.
    #[error("S3 {op} of {key}: {}", status_sentence(*status, bucket, credentials_from))]
    Status {
        /// What was asked.
        op: &'static str,
        /// The object key, `s3://BUCKET/KEY`.
        key: String,
        /// The bucket.
        bucket: String,
        /// Where the credentials the request was signed with came from
        /// (`S3Config::credentials_from`; empty when not known).
        credentials_from: String,
        /// The status.
        status: u16,
    },
    /// The server refused a request with one of the common S3 errors: one
    /// sentence with the fix, then the server's answer (code, message,
    /// request id; never its raw XML).
    #[error("S3 {op} of {key}: {}: {answer}", refusal.sentence(bucket, credentials_from))]
    Refused {
        /// The request.
        op: &'static str,
        /// The object key, `s3://BUCKET/KEY`.
        key: String,
        /// The bucket.
        bucket: String,
        /// What the server's error code means.
        refusal: S3Refusal,
        /// Where the credentials the request was signed with came from
        /// (`S3Config::credentials_from`; empty when not known).
        credentials_from: String,
        /// What the server answered.
        #[source]
        answer: Box<ServerAnswer>,
    },
    /// The object does not exist.
    #[error("S3 object {key} does not exist")]
    NotFound {
        /// The object key.
        key: String,
    },
    /// The object is larger than the most that is read of it.
    #[error("S3 object {key} has {size} bytes or more; at most {max} are read")]
    TooLarge {
        /// The object key.
        key: String,
        /// The size seen so far (or announced).
        size: u64,
        /// The limit.
        max: u64,
    },
    /// A listing holds more objects than the most that are read of it.
    #[error("S3 prefix {prefix} holds more than {max} objects; at most {max} are listed")]
    TooManyObjects {
        /// The prefix listed, `s3://BUCKET/PREFIX`.
        prefix: String,
        /// The limit.
        max: usize,
    },
    /// A create-only put found an object already there.
    #[error("S3 object {key} already exists")]
    AlreadyExists {
        /// The object key.
        key: String,
    },
    /// A multipart upload id is no longer known to the server (completed,
    /// aborted, or expired by a lifecycle rule).
    #[error("upload session of {key} is no longer known to the server: {source}")]
    UploadGone {
        /// The object key.
        key: String,
        /// The server's answer.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The `oci://REGISTRY/REPOSITORY[:TAG|@DIGEST]` argument is malformed.
    #[error(
        "{given:?} is not a registry reference: {reason} (expected oci://REGISTRY/REPOSITORY[:TAG|@sha256:HEX])"
    )]
    BadReference {
        /// What was given.
        given: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A registry request failed before an answer (network, timeout).
    #[error("registry {op} of {what}: {source}")]
    RegistryHttp {
        /// What was asked.
        op: &'static str,
        /// What it was asked of (`oci://REGISTRY/REPOSITORY@DIGEST`).
        what: String,
        /// Why.
        #[source]
        source: reqwest::Error,
    },
    /// An upload's body stopped moving, or its answer did not come, for
    /// the read timeout.
    #[error(
        "registry {op} of {what}: no progress for {secs} s (--read-timeout): {sent} of {len} body bytes sent"
    )]
    RegistryStalled {
        /// What was asked.
        op: &'static str,
        /// What it was asked of.
        what: String,
        /// The read timeout, in seconds.
        secs: u64,
        /// Body bytes handed to the connection.
        sent: u64,
        /// Body bytes of the request.
        len: u64,
    },
    /// A registry refused a request: its status and the error codes of its
    /// answer (bounded, redacted).
    #[error("registry {op} of {what}: HTTP {status}{}", if said.is_empty() { String::new() } else { format!(" ({said})") })]
    RegistryStatus {
        /// What was asked.
        op: &'static str,
        /// What it was asked of.
        what: String,
        /// The status.
        status: u16,
        /// The registry's error codes and messages, when it sent them.
        said: String,
    },
    /// Authentication with a registry cannot proceed.
    #[error("registry {registry}: {reason}")]
    RegistryAuth {
        /// `HOST[:PORT]`.
        registry: String,
        /// What is wrong (never a credential).
        reason: String,
    },
    /// An answer contradicts what was asked (no ETag, a range that is not
    /// the one asked).
    #[error("S3 {op} of {key}: {what}")]
    BadAnswer {
        /// The request.
        op: &'static str,
        /// The object key.
        key: String,
        /// What is wrong.
        what: String,
    },
}

impl ObjStoreError {
    /// What kind of failure this is: all of them are the user's to fix
    /// (a location, credentials, a server) or a re-run's to retry.
    pub fn class(&self) -> ErrorClass {
        ErrorClass::Failure
    }

    /// Whether retrying the same request may help: what `object_store`
    /// could not cure with its own retries (a dropped connection, a 5xx)
    /// may pass on a later attempt; a missing object, a refused
    /// credential or a malformed setup will not.
    pub fn is_transient(&self) -> bool {
        match self {
            ObjStoreError::Request { source, .. } => !matches!(
                source,
                object_store::Error::PermissionDenied { .. }
                    | object_store::Error::Unauthenticated { .. }
            ),
            ObjStoreError::Http { .. }
            | ObjStoreError::RegistryHttp { .. }
            | ObjStoreError::RegistryStalled { .. } => true,
            ObjStoreError::RegistryStatus { status, .. } => {
                *status >= 500 || matches!(status, 408 | 429)
            }
            ObjStoreError::Status { status, .. } => *status >= 500 || matches!(status, 408 | 429),
            ObjStoreError::Refused {
                refusal, answer, ..
            } => match refusal {
                S3Refusal::SlowDown => true,
                S3Refusal::Other => !matches!(answer.status, Some(401 | 403)),
                _ => false,
            },
            _ => false,
        }
    }

    /// Whether this is the server answering a ranged get with the whole
    /// object (a `200` to a `Range`), which `object_store` refuses itself
    /// with an error it does not expose as a type: recognised by its
    /// message, the only mark it leaves.
    pub fn is_range_ignored(&self) -> bool {
        const NOT_PARTIAL: &str = "non-partial response when range requested";
        match self {
            ObjStoreError::Request { source, .. } => {
                let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(source);
                while let Some(e) = cur {
                    if e.to_string().contains(NOT_PARTIAL) {
                        return true;
                    }
                    cur = e.source();
                }
                false
            }
            _ => false,
        }
    }

    /// This error, told where the credentials of its request came from.
    pub(crate) fn signed_with(mut self, from: &str) -> Self {
        if let ObjStoreError::Refused {
            credentials_from, ..
        } = &mut self
        {
            from.clone_into(credentials_from);
        }
        self
    }

    /// A request's error, with its key, sorted into the variants a caller
    /// decides on (refused with a known S3 error, missing, already there,
    /// upload gone).
    pub(crate) fn request(op: &'static str, key: String, source: object_store::Error) -> Self {
        if let Some(e) = ObjStoreError::refused(op, &key, &source) {
            return e;
        }
        match source {
            object_store::Error::NotFound { .. } => ObjStoreError::NotFound { key },
            object_store::Error::AlreadyExists { .. } => ObjStoreError::AlreadyExists { key },
            source => ObjStoreError::Request { op, key, source },
        }
    }

    /// `source` as [`ObjStoreError::Refused`] when the server answered
    /// with an S3 error document: always for the codes [`S3Refusal`]
    /// names, for any other code unless `object_store` sorted the answer
    /// into a kind a caller decides on (missing, already there,
    /// precondition).
    pub(crate) fn refused(
        op: &'static str,
        key: &str,
        source: &object_store::Error,
    ) -> Option<Self> {
        let answer = ServerAnswer::of(source)?;
        let refusal = S3Refusal::from_code(&answer.code);
        let sorted = matches!(
            source,
            object_store::Error::NotFound { .. }
                | object_store::Error::AlreadyExists { .. }
                | object_store::Error::Precondition { .. }
                | object_store::Error::NotModified { .. }
        );
        if refusal == S3Refusal::Other && sorted {
            return None;
        }
        let bucket = key
            .strip_prefix("s3://")
            .and_then(|k| k.split('/').next())
            .unwrap_or_default()
            .to_owned();
        Some(ObjStoreError::Refused {
            op,
            key: key.to_owned(),
            bucket,
            refusal,
            credentials_from: String::new(),
            answer: Box::new(answer),
        })
    }
}

/// The common S3 errors, each with a sentence saying what to fix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum S3Refusal {
    /// `NoSuchBucket`: the bucket itself is missing (not the object).
    NoSuchBucket,
    /// `AccessDenied`: the credentials are known, their policy refuses.
    AccessDenied,
    /// `InvalidAccessKeyId`: the server knows no such access key.
    InvalidAccessKeyId,
    /// `SignatureDoesNotMatch`: the secret is not the access key's.
    SignatureDoesNotMatch,
    /// `SlowDown`: the server sheds load (a 503), still after retries.
    SlowDown,
    /// Another error code: the server's answer says what it is.
    Other,
}

impl S3Refusal {
    /// The refusal an S3 error code names.
    pub fn from_code(code: &str) -> S3Refusal {
        match code {
            "NoSuchBucket" => S3Refusal::NoSuchBucket,
            "AccessDenied" => S3Refusal::AccessDenied,
            "InvalidAccessKeyId" => S3Refusal::InvalidAccessKeyId,
            "SignatureDoesNotMatch" => S3Refusal::SignatureDoesNotMatch,
            "SlowDown" => S3Refusal::SlowDown,
            _ => S3Refusal::Other,
        }
    }

    /// What went wrong and what to fix, naming `bucket` and where the
    /// credentials came from (`credentials_from`, when known) where it
    /// helps.
    pub fn sentence(self, bucket: &str, credentials_from: &str) -> String {
        let these = if credentials_from.is_empty() {
            "these credentials".to_owned()
        } else {
            format!("the credentials from {credentials_from}")
        };
        match self {
            S3Refusal::NoSuchBucket => format!(
                "the bucket {bucket} does not exist on this endpoint (the bucket, not only the \
                 object): check the bucket name in the s3:// location, the endpoint and the region"
            ),
            S3Refusal::AccessDenied => format!(
                "access denied: the server knows {these} but their policy does not allow this \
                 request; grant them access to bucket {bucket}, or use credentials that have it"
            ),
            S3Refusal::InvalidAccessKeyId => format!(
                "the server knows no such access key id ({these}): the key is mistyped, \
                 deleted, or for another endpoint or account; check AWS_ACCESS_KEY_ID or \
                 AWS_PROFILE"
            ),
            S3Refusal::SignatureDoesNotMatch => format!(
                "the request signature does not match ({these}): the secret access key is not \
                 the one of this access key id (or a proxy changed the request); check \
                 AWS_SECRET_ACCESS_KEY or the profile's aws_secret_access_key"
            ),
            S3Refusal::SlowDown => "the server asked to slow down (SlowDown) and still did \
                 after retries: run again later, or with fewer --connections"
                .to_owned(),
            S3Refusal::Other => "the server refused the request".to_owned(),
        }
    }
}

/// What a refused request's status alone says (an answer to a HEAD has no
/// error document): the refusal it most likely is, and the fix.
fn status_sentence(status: u16, bucket: &str, credentials_from: &str) -> String {
    let these = if credentials_from.is_empty() {
        "these credentials".to_owned()
    } else {
        format!("the credentials from {credentials_from}")
    };
    match status {
        403 => format!(
            "the server answered HTTP 403 with no error document (a HEAD has none): {these} are \
             refused for bucket {bucket}; either their policy does not allow reading objects \
             (s3:GetObject), or the access key or its secret is not valid on this endpoint \
             (check AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY or the profile)"
        ),
        503 => format!(
            "HTTP 503: {}",
            S3Refusal::SlowDown.sentence(bucket, credentials_from)
        ),
        _ => format!("the server answered HTTP {status}"),
    }
}

/// Longest text kept of one field of a server's error answer.
const MAX_ANSWER_FIELD: usize = 256;

/// What an S3 server answered to a refused request: its HTTP status and
/// error code, its message and request id (each bounded, control
/// characters dropped, secrets redacted), never its raw XML.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerAnswer {
    /// The HTTP status.
    pub status: Option<u16>,
    /// The `<Code>`.
    pub code: String,
    /// The `<Message>`, when given.
    pub message: Option<String>,
    /// The `<RequestId>`, when given.
    pub request_id: Option<String>,
}

impl std::fmt::Display for ServerAnswer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the server answered")?;
        if let Some(s) = self.status {
            write!(f, " HTTP {s}")?;
        }
        write!(f, " {}", self.code)?;
        if let Some(m) = &self.message {
            write!(f, " ({m})")?;
        }
        if let Some(r) = &self.request_id {
            write!(f, ", request id {r}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ServerAnswer {}

impl ServerAnswer {
    /// The answer inside `e`'s chain: `object_store` keeps the server's
    /// body only in its error text (its retry error type is private), so
    /// the status and the XML elements are read from that text.
    pub fn of(e: &object_store::Error) -> Option<ServerAnswer> {
        let mut text = String::new();
        let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
        while let Some(c) = cur {
            text.push_str(&c.to_string());
            text.push('\n');
            cur = c.source();
        }
        let code = xml_element(&text, "Code")?;
        let status = text
            .split_once("status code: ")
            .and_then(|(_, rest)| rest.get(..3))
            .and_then(|s| s.parse().ok());
        Some(ServerAnswer {
            status,
            code,
            message: xml_element(&text, "Message"),
            request_id: xml_element(&text, "RequestId"),
        })
    }
}

/// The text of the first `<NAME>` element of `text`, secrets redacted,
/// without control characters, bounded; `None` when absent or empty.
/// Redaction comes before the cut, so a secret straddling the cut is
/// still found whole.
fn xml_element(text: &str, name: &str) -> Option<String> {
    let open = format!("<{name}>");
    let close = format!("</{name}>");
    let start = text.find(&open)? + open.len();
    let len = text.get(start..)?.find(&close)?;
    let raw = text.get(start..start + len)?;
    let value: String = ftpipe_secrets::redact(raw.trim())
        .chars()
        .filter(|c| !c.is_control())
        .take(MAX_ANSWER_FIELD)
        .collect();
    let value = value.trim().to_owned();
    (!value.is_empty()).then_some(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(source: object_store::Error) -> ObjStoreError {
        ObjStoreError::Request {
            op: "get",
            key: "s3://b/k".into(),
            source,
        }
    }

    fn generic(message: &str) -> object_store::Error {
        object_store::Error::Generic {
            store: "S3",
            source: Box::new(std::io::Error::other(message.to_owned())),
        }
    }

    #[test]
    fn a_200_to_a_range_is_recognised_and_a_refused_credential_is_not_transient() {
        let ignored = request(generic(
            "Received non-partial response when range requested",
        ));
        assert!(ignored.is_range_ignored());
        assert!(!request(generic("connection reset")).is_range_ignored());
        assert!(request(generic("connection reset")).is_transient());
        let denied = request(object_store::Error::PermissionDenied {
            path: "k".into(),
            source: Box::new(std::io::Error::other("403")),
        });
        assert!(!denied.is_transient());
        let gone = ObjStoreError::NotFound { key: "k".into() };
        assert!(!gone.is_transient() && !gone.is_range_ignored());
    }

    #[test]
    fn a_known_s3_code_is_one_sentence_and_the_answer_without_xml() {
        let body = "Server returned non-2xx status code: 404 Not Found: <?xml version=\"1.0\"?>\
            <Error><Code>NoSuchBucket</Code><Message>The specified bucket does not exist</Message>\
            <BucketName>nope</BucketName><RequestId>REQ1</RequestId></Error>";
        let e = ObjStoreError::request(
            "get",
            "s3://nope/p/manifest.json".into(),
            object_store::Error::NotFound {
                path: "p/manifest.json".into(),
                source: Box::new(std::io::Error::other(body)),
            },
        );
        let text = e.to_string();
        assert!(
            matches!(
                e,
                ObjStoreError::Refused {
                    refusal: S3Refusal::NoSuchBucket,
                    ..
                }
            ),
            "{text}"
        );
        assert!(text.contains("the bucket nope does not exist"), "{text}");
        assert!(text.contains("HTTP 404 NoSuchBucket"), "{text}");
        assert!(text.contains("request id REQ1"), "{text}");
        assert!(!text.contains('<'), "{text}");
        // Another code stays what object_store said (a missing object).
        let e = ObjStoreError::request(
            "get",
            "s3://b/k".into(),
            object_store::Error::NotFound {
                path: "k".into(),
                source: Box::new(std::io::Error::other(
                    "<Error><Code>NoSuchKey</Code></Error>",
                )),
            },
        );
        assert!(matches!(e, ObjStoreError::NotFound { .. }), "{e}");
        // Any other code: the answer without its XML.
        let e = ObjStoreError::request(
            "get",
            "s3://b/k".into(),
            generic(
                "status code: 400 Bad Request: <?xml?><Error><Code>InvalidToken</Code></Error>",
            ),
        );
        assert!(e.to_string().contains("HTTP 400 InvalidToken"), "{e}");
        assert!(!e.to_string().contains('<'), "{e}");
        let slow = ObjStoreError::request(
            "get",
            "s3://b/k".into(),
            generic("status code: 503 Slow Down: <Code>SlowDown</Code>"),
        );
        assert!(slow.is_transient(), "{slow}");
    }

    /// A server's message holding a secret across the field's bound: the
    /// secret was cut first and its visible prefix escaped redaction.
    #[test]
    fn a_secret_across_the_answer_bound_is_redacted_whole() {
        ftpipe_secrets::register("s3_answer_secret_value_0001");
        let text = format!(
            "<Message>{} s3_answer_secret_value_0001</Message>",
            "x".repeat(MAX_ANSWER_FIELD - 20)
        );
        let m = xml_element(&text, "Message").unwrap();
        assert!(m.chars().count() <= MAX_ANSWER_FIELD, "{m}");
        assert!(!m.contains("s3_answer_secr"), "{m}");
    }
}
