//! Errors of conversion planning: each names the file, tensor or config
//! field at fault and what was expected, before any output is written.

use super::safetensors::SourceError;

/// A source checkpoint that cannot be planned (or converted) as it is.
#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    /// A safetensors header failed validation.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// A component identity could not be hashed.
    #[error(transparent)]
    Artifact(#[from] ftpipe_artifact::ArtifactError),
    /// No profile handles this `model_type`.
    #[error(
        "{file}: unknown model_type {model_type:?}; known profiles: {known}; for any other model write a TOML recipe and pass --recipe FILE.toml"
    )]
    UnknownModelType {
        file: String,
        model_type: String,
        known: String,
    },
    /// A recipe is unusable, or the source contradicts it.
    #[error(transparent)]
    Recipe(#[from] super::recipe::RecipeError),
    /// Two tensors land in the same expert field.
    #[error("layer {layer}: expert {expert} field {field} is given by both {first} and {second}")]
    DuplicateExpertField {
        layer: u64,
        expert: u64,
        field: String,
        first: String,
        second: String,
    },
    /// The experts of a layer are not numbered 0..E-1.
    #[error(
        "layer {layer}: expert {missing} is missing (experts must be numbered 0..E-1 without gaps; the highest found is {highest})"
    )]
    ExpertGap {
        layer: u64,
        missing: u64,
        highest: u64,
    },
    /// A glob of a config field does not compile.
    #[error("{file}: {field} has an invalid pattern {pattern:?}: {source}")]
    InvalidConfigGlob {
        file: String,
        field: String,
        pattern: String,
        #[source]
        source: Box<globset::Error>,
    },
    /// A config field is missing or has the wrong type.
    #[error("{file}: {field} {problem}")]
    BadConfig {
        file: String,
        field: String,
        problem: String,
    },
    /// A JSON file (config, index) does not parse.
    #[error("{file}: malformed JSON: {source}")]
    MalformedJson {
        file: String,
        #[source]
        source: serde_json::Error,
    },
    /// A JSON file (config, index) exceeds its size limit.
    #[error("{file}: malformed JSON: {len} bytes exceed the limit of {limit}")]
    JsonTooLarge { file: String, len: u64, limit: u64 },
    /// A key repeats in a JSON object of a source file (a map would keep
    /// only the last).
    #[error("{file}: duplicate key(s): {keys}")]
    DuplicateJsonKeys { file: String, keys: String },
    /// A file the plan needs is not there.
    #[error("{file} is missing from the source checkpoint")]
    MissingFile { file: String },
    /// The index and the shard headers disagree.
    #[error("{file}: tensor {tensor}: {problem}")]
    IndexMismatch {
        file: String,
        tensor: String,
        problem: String,
    },
    /// The same tensor is stored in two files.
    #[error("tensor {tensor} is stored in both {first} and {second}")]
    DuplicateTensor {
        tensor: String,
        first: String,
        second: String,
    },
    /// A tensor the profile requires is absent.
    #[error("missing tensor {tensor} (needed for {needed_for})")]
    MissingTensor { tensor: String, needed_for: String },
    /// A tensor no rule of the profile accounts for.
    #[error("{file}: unexpected tensor {tensor} ({reason})")]
    UnexpectedTensor {
        file: String,
        tensor: String,
        reason: String,
    },
    /// A tensor's shape contradicts the config.
    #[error(
        "{file}: tensor {tensor} has shape {actual:?}, config implies {expected:?} ({because})"
    )]
    ShapeMismatch {
        file: String,
        tensor: String,
        expected: Vec<u64>,
        actual: Vec<u64>,
        because: String,
    },
    /// A tensor's dtype is not one the profile accepts here.
    #[error("{file}: tensor {tensor} has dtype {actual}, expected {expected}")]
    DtypeMismatch {
        file: String,
        tensor: String,
        expected: String,
        actual: String,
    },
    /// A tensor named in `quantization_config.ignore` or matched by a
    /// `--protect` glob (`by`) is quantized in the source.
    #[error("{file}: tensor {tensor} is protected by {by} but stored quantized")]
    ProtectedQuantized {
        file: String,
        tensor: String,
        by: String,
    },
    /// A `--protect` glob cannot be used.
    #[error("invalid --protect option {glob:?}: {problem}")]
    BadProtect { glob: String, problem: String },
    /// A `--protect` glob does not compile.
    #[error("invalid --protect option {glob:?}: {source}")]
    InvalidProtectGlob {
        glob: String,
        #[source]
        source: globset::Error,
    },
    /// A ModelOpt activation `input_scale` beside a module that is not
    /// stored as NVFP4.
    #[error(
        "{file}: tensor {tensor} is an activation input_scale, but {module} is not stored as ModelOpt NVFP4 ({expected} is missing); an input_scale is accepted only beside NVFP4 weights"
    )]
    OrphanInputScale {
        file: String,
        tensor: String,
        module: String,
        expected: String,
    },
    /// Experts of one layer do not share one record layout.
    #[error("layer {layer}: expert {expert} field {field} is {found}, expert 0 has {expected}")]
    MixedExpertLayout {
        layer: u64,
        expert: u64,
        field: String,
        expected: String,
        found: String,
    },
    /// Text tensors that disagree with the release layout the config
    /// implies: every mismatch, one per line (`file: tensor: expected …,
    /// found …`).
    #[error(
        "{count} text tensor(s) disagree with the {profile} release layout config.json implies:\n{problems}"
    )]
    ReleaseLayout {
        profile: String,
        count: usize,
        problems: String,
    },
    /// Tensors outside every partition (text, vision, mtp) of the release.
    #[error(
        "{count} tensor(s) belong to no known partition (text model.language_model.* and lm_head.weight, vision model.visual.*, mtp mtp.*):\n{tensors}"
    )]
    UnknownPartition { count: usize, tensors: String },
    /// A lookup buffer's values differ from those the config fixes
    /// (`problem`: `holds ACTUAL, expected EXPECTED (why)`).
    #[error("{file}: {tensor} {problem}")]
    LookupBufferMismatch {
        file: String,
        tensor: String,
        problem: String,
    },
    /// The PLE table disagrees with the config's geometry.
    #[error("PLE table of layer {layer}: {problem}")]
    PleGeometry { layer: u64, problem: String },
    /// A predicted layout is invalid for the target format.
    #[error("component {component}: {source}")]
    Format {
        component: String,
        #[source]
        source: ftpipe_formats::FormatError,
    },
    /// A source file could not be read where the plan put a tensor.
    #[error("{file}: tensor {tensor}: cannot read at offset {offset}: {source}")]
    SourceRead {
        file: String,
        tensor: String,
        offset: u64,
        #[source]
        source: std::io::Error,
    },
    /// A tensor read whole holds the wrong number of bytes.
    #[error("{file}: tensor {tensor}: cannot read at offset {offset}: {problem}")]
    BadSourceValue {
        file: String,
        tensor: String,
        offset: u64,
        problem: String,
    },
    /// A tensor to be quantized holds NaN or infinity.
    #[error(
        "{file}: tensor {tensor}: element {index} is {value}, a finite value is required to quantize it"
    )]
    NonFinite {
        file: String,
        tensor: String,
        index: u64,
        value: f32,
    },
    /// A component came out a different size than predicted.
    #[error("component {component}: wrote {actual} bytes, the plan predicted {predicted}")]
    SizeMismatch {
        component: String,
        predicted: u64,
        actual: u64,
    },
    /// A Q3 segment was scheduled before its table's global scale existed.
    #[error("component {component}: the global scale of PLE layer {layer} is not written yet")]
    MissingGlobalScale { component: String, layer: u64 },
    /// A component on disk does not match its receipt.
    #[error("component {component}: SHA-256 {actual} on disk, its receipt says {expected}")]
    ComponentDigest {
        component: String,
        expected: String,
        actual: String,
    },
    /// A component must be (re)built but a source it reads was retired.
    #[error(
        "component {component} has no valid receipt and must be written, but its source {source_file} was retired by --retire-sources ({run}); re-acquire the sources with `ftpipe fetch --reacquire` and convert again (every other component was written)"
    )]
    SourceRetired {
        component: String,
        source_file: String,
        run: RetiredBy,
    },
    /// A stale artifact cannot be rebuilt: a shard it needs was retired.
    #[error(
        "the artifact in {dir} was made under another identity ({reasons}) and cannot be rebuilt here: component {component} reads {source_file}, retired by --retire-sources ({run}); re-acquire the sources with `ftpipe fetch --reacquire` first, then convert with --rebuild (the artifact was left as it is)"
    )]
    RebuildNeedsSources {
        dir: String,
        reasons: String,
        component: String,
        source_file: String,
        run: RetiredBy,
    },
    /// A retired shard's header was not saved, so nothing can be planned.
    #[error(
        "source {source_file} was retired by --retire-sources ({run}) and the header of this version of it is not saved in {skeleton}, so the conversion cannot be planned; re-acquire the sources with `ftpipe fetch --reacquire` and convert again"
    )]
    RetiredHeaderMissing {
        source_file: String,
        run: RetiredBy,
        skeleton: String,
    },
    /// Conversion needs verified sources.
    #[error("{file} has no download receipt: fetch (and verify) the checkpoint before converting")]
    NotFetched { file: String },
    /// Selected source files without a download receipt (a complete `.part`
    /// is not a published file).
    #[error(
        "{count} source file(s) have no download receipt ({}): run `ftpipe fetch` (or `ftpipe run`) to finish and verify them before converting",
        files.join(", ")
    )]
    SourcesNotFetched { count: usize, files: Vec<String> },
    /// A broken invariant of planning or conversion: a bug, not bad input.
    #[error(
        "internal error (a bug, please report it): {what}{}",
        source.as_ref().map_or_else(String::new, |s| format!(": {s}"))
    )]
    Internal {
        what: String,
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// Existing output was made under another identity.
    #[error(
        "the artifact in {dir} was made by a different converter variant or from different sources and will not be reused: {reasons}; re-run with --rebuild to rebuild it (the old artifact is kept aside as evidence)"
    )]
    StaleArtifact { dir: String, reasons: String },
}

/// Which run retired a source, as the retirement log says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetiredBy(pub Option<ftpipe_receipts::RunId>);

impl std::fmt::Display for RetiredBy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(run) => write!(f, "run {run}"),
            None => f.write_str("a run the retirement log does not name"),
        }
    }
}

impl ConvertError {
    /// A broken invariant (see [`ConvertError::Internal`]).
    pub fn internal(what: impl Into<String>) -> Self {
        ConvertError::Internal {
            what: what.into(),
            source: None,
        }
    }

    /// An internal failure with its cause.
    pub fn internal_from(
        what: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        ConvertError::Internal {
            what: what.into(),
            source: Some(Box::new(source)),
        }
    }
}
