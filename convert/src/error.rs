//! Errors of conversion planning: each names the file, tensor or config
//! field at fault and what was expected, before any output is written.

use std::path::PathBuf;

use ftpipe_fs::ErrorClass;

use crate::safetensors::SourceError;

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
        /// The config file giving the model_type (repo-relative).
        file: String,
        /// The model_type the config gives.
        model_type: String,
        /// The model types a built-in profile handles, comma-separated.
        known: String,
    },
    /// A recipe is unusable, or the source contradicts it.
    #[error(transparent)]
    Recipe(#[from] crate::recipe::RecipeError),
    /// A small input file (config, index, recipe, saved state) that is not
    /// a regular file of at most its named limit; names the path.
    #[error(transparent)]
    Read(#[from] ftpipe_fs::bounded::BoundedReadError),
    /// `--include` / `--exclude` leaves out a file the conversion reads.
    #[error(
        "{file} is needed for the conversion but the fetch selection leaves it out ({by}); \
         change the globs so it is fetched (only `ftpipe fetch` may leave it out)"
    )]
    NeededFileExcluded {
        /// The file (`config.json`, the index).
        file: String,
        /// The glob that leaves it out, as `--exclude "GLOB"` or the
        /// `--include` globs it does not match.
        by: String,
    },
    /// Two tensors land in the same expert field.
    #[error("layer {layer}: expert {expert} field {field} is given by both {first} and {second}")]
    DuplicateExpertField {
        /// The layer index.
        layer: u64,
        /// The expert index.
        expert: u64,
        /// The expert field both tensors land in.
        field: String,
        /// The tensor that gives the field first.
        first: String,
        /// The tensor that gives it again.
        second: String,
    },
    /// The experts of a layer are not numbered 0..E-1.
    #[error(
        "layer {layer}: expert {missing} is missing (experts must be numbered 0..E-1 without gaps; the highest found is {highest})"
    )]
    ExpertGap {
        /// The layer index.
        layer: u64,
        /// The lowest expert number that is absent.
        missing: u64,
        /// The highest expert number found.
        highest: u64,
    },
    /// A glob of a config field does not compile.
    #[error("{file}: {field} has an invalid pattern {pattern:?}: {source}")]
    InvalidConfigGlob {
        /// The config file holding the pattern (repo-relative).
        file: String,
        /// The config field holding the pattern.
        field: String,
        /// The pattern that does not compile (all of them, space-separated, if the set fails).
        pattern: String,
        /// The glob compiler's error.
        #[source]
        source: Box<globset::Error>,
    },
    /// A config field is missing or has the wrong type.
    #[error("{file}: {field} {problem}")]
    BadConfig {
        /// The config file at fault (repo-relative).
        file: String,
        /// The config field at fault (dotted path).
        field: String,
        /// What is wrong with the field.
        problem: String,
    },
    /// A JSON file (config, index) does not parse.
    #[error("{file}: malformed JSON: {source}")]
    MalformedJson {
        /// The JSON file at fault (repo-relative).
        file: String,
        /// The JSON parser's error.
        #[source]
        source: serde_json::Error,
    },
    /// A JSON file (config, index) exceeds its size limit.
    #[error("{file}: malformed JSON: {len} bytes exceed the limit of {limit}")]
    JsonTooLarge {
        /// The JSON file at fault (repo-relative).
        file: String,
        /// The file's size in bytes.
        len: u64,
        /// The largest size accepted, in bytes.
        limit: u64,
    },
    /// A source's JSON holds a credential this process sent (a server
    /// echoing the token into the file); it would reach the plan and the
    /// manifest, so the file is refused.
    #[error("{file}: holds the hub token this process sent; refusing the file")]
    HoldsCredential {
        /// The JSON file at fault (repo-relative).
        file: String,
    },
    /// A key repeats in a JSON object of a source file (a map would keep
    /// only the last).
    #[error("{file}: duplicate key(s): {keys}")]
    DuplicateJsonKeys {
        /// The JSON file at fault (repo-relative).
        file: String,
        /// The repeated keys, with the objects they repeat in.
        keys: String,
    },
    /// A file the plan needs is not there.
    #[error("{file} is missing from the source checkpoint")]
    MissingFile {
        /// The missing file (repo-relative).
        file: String,
    },
    /// The index and the shard headers disagree.
    #[error("{file}: tensor {tensor}: {problem}")]
    IndexMismatch {
        /// The shard whose header holds the tensor (repo-relative).
        file: String,
        /// The tensor name.
        tensor: String,
        /// How the index disagrees with the header.
        problem: String,
    },
    /// The same tensor is stored in two files.
    #[error("tensor {tensor} is stored in both {first} and {second}")]
    DuplicateTensor {
        /// The tensor name.
        tensor: String,
        /// The file(s) storing it first (repo-relative, comma-separated).
        first: String,
        /// The file(s) storing it again (repo-relative, comma-separated).
        second: String,
    },
    /// A tensor the profile requires is absent.
    #[error("missing tensor {tensor} (needed for {needed_for})")]
    MissingTensor {
        /// The name of the absent tensor.
        tensor: String,
        /// What the tensor is needed for.
        needed_for: String,
    },
    /// A tensor no rule of the profile accounts for.
    #[error("{file}: unexpected tensor {tensor} ({reason})")]
    UnexpectedTensor {
        /// The source file holding the tensor (repo-relative).
        file: String,
        /// The tensor name.
        tensor: String,
        /// Why no rule accounts for the tensor.
        reason: String,
    },
    /// A tensor's shape contradicts the config.
    #[error(
        "{file}: tensor {tensor} has shape {actual:?}, config implies {expected:?} ({because})"
    )]
    ShapeMismatch {
        /// The source file holding the tensor (repo-relative).
        file: String,
        /// The tensor name.
        tensor: String,
        /// The shape the config implies.
        expected: Vec<u64>,
        /// The shape the header gives.
        actual: Vec<u64>,
        /// Which config fields imply the expected shape, and how.
        because: String,
    },
    /// A tensor's dtype is not one the profile accepts here.
    #[error("{file}: tensor {tensor} has dtype {actual}, expected {expected}")]
    DtypeMismatch {
        /// The source file holding the tensor (repo-relative).
        file: String,
        /// The tensor name.
        tensor: String,
        /// The dtype(s) the profile accepts here.
        expected: String,
        /// The dtype the header gives.
        actual: String,
    },
    /// A tensor named in `quantization_config.ignore` or matched by a
    /// `--protect` glob (`by`) is quantized in the source.
    #[error("{file}: tensor {tensor} is protected by {by} but stored quantized")]
    ProtectedQuantized {
        /// The source file holding the tensor (repo-relative).
        file: String,
        /// The tensor name.
        tensor: String,
        /// What protects it: `quantization_config.ignore` or the `--protect` glob.
        by: String,
    },
    /// A `--protect` glob cannot be used.
    #[error("invalid --protect option {glob:?}: {problem}")]
    BadProtect {
        /// The `--protect` glob as given.
        glob: String,
        /// Why the glob cannot be used.
        problem: String,
    },
    /// A `--protect` glob does not compile.
    #[error("invalid --protect option {glob:?}: {source}")]
    InvalidProtectGlob {
        /// The `--protect` glob as given.
        glob: String,
        /// The glob compiler's error.
        #[source]
        source: globset::Error,
    },
    /// A ModelOpt activation `input_scale` beside a module that is not
    /// stored as NVFP4.
    #[error(
        "{file}: tensor {tensor} is an activation input_scale, but {module} is not stored as ModelOpt NVFP4 ({expected} is missing); an input_scale is accepted only beside NVFP4 weights"
    )]
    OrphanInputScale {
        /// The source file holding the tensor (repo-relative).
        file: String,
        /// The `input_scale` tensor name.
        tensor: String,
        /// The module the scale belongs to.
        module: String,
        /// The NVFP4 tensor of the module that is missing.
        expected: String,
    },
    /// Experts of one layer do not share one record layout.
    #[error("layer {layer}: expert {expert} field {field} is {found}, expert 0 has {expected}")]
    MixedExpertLayout {
        /// The layer index.
        layer: u64,
        /// The expert whose layout differs from expert 0's.
        expert: u64,
        /// The expert field that differs.
        field: String,
        /// Expert 0's layout of the field (`dtype kind shape`).
        expected: String,
        /// This expert's layout of the field (`dtype kind shape`).
        found: String,
    },
    /// Text tensors that disagree with the release layout the config
    /// implies: every mismatch, one per line (`file: tensor: expected …,
    /// found …`).
    #[error(
        "{count} text tensor(s) disagree with the {profile} release layout config.json implies:\n{problems}"
    )]
    ReleaseLayout {
        /// The release profile config.json implies.
        profile: String,
        /// How many text tensors disagree.
        count: usize,
        /// Every mismatch, one per line.
        problems: String,
    },
    /// Tensors outside every partition (text, vision, mtp) of the release.
    #[error(
        "{count} tensor(s) belong to no known partition (text model.language_model.* and lm_head.weight, vision model.visual.*, mtp mtp.*):\n{tensors}"
    )]
    UnknownPartition {
        /// How many tensors belong to no partition.
        count: usize,
        /// Their names, one per line.
        tensors: String,
    },
    /// Files left out of the fetch hold tensors the artifact needs: only
    /// tensors of an omitted partition (vision, mtp) may stay unfetched.
    #[error(
        "{count} file(s) left out of the fetch hold tensors the {profile} artifact needs (only vision model.visual.* and mtp mtp.* tensors may be left unfetched; fetch these files or narrow the --exclude glob):\n{problems}"
    )]
    ExcludedSourceNeeded {
        /// The profile converting.
        profile: String,
        /// How many left-out files hold needed tensors.
        count: usize,
        /// One line per file: its path, the glob that left it out, how many
        /// needed tensors it holds and the first few of them.
        problems: String,
    },
    /// A lookup buffer's values differ from those the config fixes
    /// (`problem`: `holds ACTUAL, expected EXPECTED (why)`).
    #[error("{file}: {tensor} {problem}")]
    LookupBufferMismatch {
        /// The source file holding the buffer (repo-relative).
        file: String,
        /// The lookup buffer's tensor name.
        tensor: String,
        /// The values held, those expected, and why.
        problem: String,
    },
    /// The PLE table disagrees with the config's geometry.
    #[error("PLE table of layer {layer}: {problem}")]
    PleGeometry {
        /// The PLE layer index.
        layer: u64,
        /// How the table disagrees with the config.
        problem: String,
    },
    /// A predicted layout is invalid for the target format.
    #[error("component {component}: {source}")]
    Format {
        /// The component whose layout is invalid.
        component: String,
        /// The target format's error.
        #[source]
        source: ftpipe_formats::FormatError,
    },
    /// A source file could not be read where the plan put a tensor.
    #[error("{file}: tensor {tensor}: cannot read at offset {offset}: {source}")]
    SourceRead {
        /// The source file that could not be read (repo-relative).
        file: String,
        /// The tensor being read.
        tensor: String,
        /// Absolute byte offset in the file where the read failed.
        offset: u64,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A tensor read whole holds the wrong number of bytes.
    #[error("{file}: tensor {tensor}: cannot read at offset {offset}: {problem}")]
    BadSourceValue {
        /// The source file holding the tensor (repo-relative).
        file: String,
        /// The tensor name.
        tensor: String,
        /// Absolute byte offset of the tensor in the file.
        offset: u64,
        /// How the bytes read differ from what the tensor must hold.
        problem: String,
    },
    /// A tensor to be quantized holds NaN or infinity.
    #[error(
        "{file}: tensor {tensor}: element {index} is {value}, a finite value is required to quantize it"
    )]
    NonFinite {
        /// The source file holding the tensor (repo-relative).
        file: String,
        /// The tensor name.
        tensor: String,
        /// Index of the first non-finite element in the tensor.
        index: u64,
        /// The non-finite value (NaN or infinity).
        value: f32,
    },
    /// A component came out a different size than predicted.
    #[error("component {component}: wrote {actual} bytes, the plan predicted {predicted}")]
    SizeMismatch {
        /// The component name.
        component: String,
        /// The size in bytes the plan predicted.
        predicted: u64,
        /// The size in bytes actually written.
        actual: u64,
    },
    /// A Q3 segment was scheduled before its table's global scale existed.
    #[error("component {component}: the global scale of PLE layer {layer} is not written yet")]
    MissingGlobalScale {
        /// The component holding the Q3 segment.
        component: String,
        /// The PLE layer whose global scale is not written yet.
        layer: u64,
    },
    /// A component on disk does not match its receipt.
    #[error("component {component}: SHA-256 {actual} on disk, its receipt says {expected}")]
    ComponentDigest {
        /// The component name.
        component: String,
        /// The SHA-256 its receipt records.
        expected: String,
        /// The SHA-256 of the file on disk.
        actual: String,
    },
    /// A small file read whole for the plan (config, index) does not have
    /// the digest the pinned listing gives it.
    #[error(
        "{file}: the bytes the server sent for the plan have {kind} {actual}, the pinned listing says {expected}: the server sent another version of the file; nothing was planned from it"
    )]
    SmallFileDigest {
        /// The file (repo-relative).
        file: String,
        /// `sha256` or `git-sha1`.
        kind: &'static str,
        /// The listing's digest.
        expected: String,
        /// The digest of the bytes received.
        actual: String,
    },
    /// A verified shard's header is not the one its ranged read gave when
    /// the run was planned.
    #[error(
        "{source_file}: the verified file's header ({len} bytes of file) is not the header read over HTTP Range when this run was planned ({planned_len} bytes of file): the server answered the ranged read with other bytes; nothing was converted from it, run again to plan from the verified file"
    )]
    HeaderNotPlanned {
        /// The shard (repo-relative).
        source_file: String,
        /// The verified file's length.
        len: u64,
        /// The length planned for.
        planned_len: u64,
    },
    /// Under `--disk-budget`, sources left on disk by an earlier run hold
    /// the budget and no admitted file can free it.
    #[error(
        "--disk-budget {budget} bytes: {held} bytes of sources on disk ({untracked} of them in DIR/source/ files this run does not fetch, such as an earlier pin's or selection's) leave no room for {next} ({size} bytes), and nothing in flight can free any; raise the budget to at least {needed} bytes or delete what DIR/source/ should not hold"
    )]
    DiskBudgetStuck {
        /// The budget.
        budget: u64,
        /// Source bytes held.
        held: u64,
        /// Of them, bytes of files the run does not fetch.
        untracked: u64,
        /// The next file in the schedule's order.
        next: String,
        /// Its size.
        size: u64,
        /// held + size.
        needed: u64,
    },
    /// A component must be (re)built but a source it reads was retired.
    #[error(
        "component {component} has no valid receipt and must be written, but its source {source_file} was retired by --retire-sources ({run}); re-acquire the sources with `ftpipe fetch --reacquire` and convert again (every other component was written)"
    )]
    SourceRetired {
        /// The component that must be written.
        component: String,
        /// The retired source file it reads (repo-relative).
        source_file: String,
        /// The run that retired the source.
        run: RetiredBy,
    },
    /// A component must be written from a source a budgeted run punched
    /// down to its PLE spans.
    #[error(
        "component {component} has no valid receipt and must be written, but a budgeted run kept only the PLE spans of its source {source_file} once its other spans were written into the components' temp files; run `ftpipe run` again (it resumes those components from their span claims), or fetch the file again with `ftpipe fetch --reacquire`"
    )]
    SourcePunched {
        /// The component that must be written.
        component: String,
        /// The punched source file it reads (repo-relative).
        source_file: String,
    },
    /// A range a punched source keeps no longer hashes to the digest
    /// recorded before its holes were punched.
    #[error(
        "source {source_file} was punched down to its PLE spans by a budgeted run, and its kept range at offset {offset} ({len} bytes) now has SHA-256 {found}, recorded {expected}: the file was changed since; fetch it again with `ftpipe fetch --reacquire`"
    )]
    KeptRangeChanged {
        /// The punched source file (repo-relative).
        source_file: String,
        /// The range's offset.
        offset: u64,
        /// Its length.
        len: u64,
        /// The SHA-256 recorded.
        expected: String,
        /// The SHA-256 read now.
        found: String,
    },
    /// The copy aside of a released source's PLE spans does not hold what
    /// was logged when it was made.
    #[error(
        "source {source_file} was released after its PLE spans were copied aside to {copy}, and the copy's range for source offset {offset} ({len} bytes, at {at} in the copy) {problem}: the copy was changed since; fetch the source again with `ftpipe fetch --reacquire`"
    )]
    KeptCopyChanged {
        /// The released source file (repo-relative).
        source_file: String,
        /// The copy's path.
        copy: String,
        /// The range's offset in the source.
        offset: u64,
        /// Its length.
        len: u64,
        /// Its offset in the copy.
        at: u64,
        /// What is wrong: the digest read now against the one recorded,
        /// or why it cannot be read.
        problem: String,
    },
    /// A stale artifact cannot be rebuilt: a shard it needs was retired.
    #[error(
        "the artifact in {dir} was made under another identity ({reasons}) and cannot be rebuilt here: component {component} reads {source_file}, retired by --retire-sources ({run}); re-acquire the sources with `ftpipe fetch --reacquire` first, then convert with --rebuild (the artifact was left as it is)"
    )]
    RebuildNeedsSources {
        /// The artifact directory.
        dir: String,
        /// How the artifact's identity differs, `; `-separated.
        reasons: String,
        /// The component that reads the retired source.
        component: String,
        /// The retired source file it reads (repo-relative).
        source_file: String,
        /// The run that retired the source.
        run: RetiredBy,
    },
    /// A retired shard's header was not saved, so nothing can be planned.
    #[error(
        "source {source_file} was retired by --retire-sources ({run}) and the header of this version of it is not saved in {skeleton}, so the conversion cannot be planned; re-acquire the sources with `ftpipe fetch --reacquire` and convert again"
    )]
    RetiredHeaderMissing {
        /// The retired source file (repo-relative).
        source_file: String,
        /// The run that retired the source.
        run: RetiredBy,
        /// The skeleton file that lacks this version's header.
        skeleton: String,
    },
    /// Conversion needs verified sources.
    #[error("{file} has no download receipt: fetch (and verify) the checkpoint before converting")]
    NotFetched {
        /// The source file without a download receipt (repo-relative).
        file: String,
    },
    /// Selected source files without a download receipt (a complete `.part`
    /// is not a published file).
    #[error(
        "{count} source file(s) have no download receipt ({}): run `ftpipe fetch` (or `ftpipe run`) to finish and verify them before converting",
        files.join(", ")
    )]
    SourcesNotFetched {
        /// How many selected files have no download receipt.
        count: usize,
        /// Those files (repo-relative).
        files: Vec<String>,
    },
    /// A broken invariant or a task that panicked or was cancelled: a bug,
    /// not bad input.
    #[error(transparent)]
    Internal(#[from] ftpipe_fs::InternalError),
    /// Existing output was made under another identity.
    #[error(
        "the artifact in {dir} was made by a different converter variant or from different sources and will not be reused: {reasons}; re-run with --rebuild to rebuild it (the old artifact is kept aside as evidence)"
    )]
    StaleArtifact {
        /// The artifact directory.
        dir: String,
        /// How the artifact's identity differs, `; `-separated.
        reasons: String,
    },
    /// The hub refused a request, or a response broke the protocol.
    #[error(transparent)]
    Hub(#[from] ftpipe_hub::HubError),
    /// The durable store failed.
    #[error(transparent)]
    Store(#[from] ftpipe_receipts::StoreError),
    /// A local filesystem operation failed.
    #[error(transparent)]
    Io(#[from] ftpipe_fs::IoError),
    /// Not enough free space before starting.
    #[error(transparent)]
    InsufficientSpace(#[from] ftpipe_fs::InsufficientSpace),
    /// `--disk-budget` is below what any schedule of whole-file retirement
    /// needs ([`crate::schedule`]); found from the plan, before a shard
    /// body is fetched.
    #[error(
        "--disk-budget {budget} bytes ({budget_shown}) is below the minimum feasible budget of {minimum} bytes ({minimum_shown}): {why}; give --disk-budget {minimum} or more"
    )]
    DiskBudgetTooSmall {
        /// The budget given, in bytes.
        budget: u64,
        /// `budget` in decimal units, for reading.
        budget_shown: String,
        /// The minimum feasible budget, in bytes.
        minimum: u64,
        /// `minimum` in decimal units.
        minimum_shown: String,
        /// What sets the minimum (the PLE files held at once, or the
        /// largest other file), with their sizes.
        why: String,
    },
    /// A path from a listing is unsafe, or a link or non-directory on disk
    /// lies on its way.
    #[error(transparent)]
    UnsafePath(#[from] ftpipe_fs::paths::PathError),
    /// Invalid user input (glob, endpoint, token file).
    #[error("invalid {what}: {message}")]
    InvalidInput {
        /// Which input is invalid (glob, endpoint, url, file...).
        what: &'static str,
        /// Why it is invalid.
        message: String,
    },
    /// A state file ftpipe wrote under `DIR/.ftpipe` does not parse: it
    /// was damaged or edited since.
    #[error("{path}: damaged state file (ftpipe wrote it; it was changed since): {source}")]
    MalformedState {
        /// The state file.
        path: PathBuf,
        /// The JSON parse error.
        #[source]
        source: serde_json::Error,
    },
    /// A state file ftpipe wrote parses but holds an impossible value.
    #[error("{path}: damaged state file (ftpipe wrote it; it was changed since): {problem}")]
    BadState {
        /// The state file.
        path: PathBuf,
        /// The impossible value and why.
        problem: String,
    },
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
    /// Wraps an I/O error with the operation and path. A full disk
    /// (`ErrorKind::StorageFull`) stays the source, which is how the
    /// binary finds it anywhere in the chain (exit 5).
    pub fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        ConvertError::Io(ftpipe_fs::IoError::new(op, path, source))
    }

    /// The hub's error this one is (a remote plan's read), if any.
    pub fn hub(&self) -> Option<&ftpipe_hub::HubError> {
        match self {
            ConvertError::Hub(e) => Some(e),
            _ => None,
        }
    }

    /// This error's [`ErrorClass`]: a bug is [`ErrorClass::Internal`]; a
    /// full disk (a failed preflight, the store's `SQLITE_FULL`, an I/O
    /// error's `ENOSPC` anywhere in the chain) [`ErrorClass::NoSpace`];
    /// the hub's, store's and artifact's errors their own class; everything
    /// else (a source, recipe or config that does not fit, a stale
    /// artifact, damaged state) [`ErrorClass::Failure`], the message naming
    /// the file and what to do.
    pub fn class(&self) -> ErrorClass {
        match self {
            ConvertError::Internal(_) => ErrorClass::Internal,
            ConvertError::InsufficientSpace(_) => ErrorClass::NoSpace,
            ConvertError::Hub(e) => e.class(),
            ConvertError::Store(e) => e.class(),
            ConvertError::Artifact(e) => e.class(),
            ConvertError::Source(e) => e.class(),
            ConvertError::Recipe(e) => e.class(),
            _ => ErrorClass::of_chain(self),
        }
    }

    /// A broken invariant (see [`ConvertError::Internal`]).
    pub fn internal(what: impl Into<String>) -> Self {
        ConvertError::Internal(ftpipe_fs::InternalError::new(what))
    }

    /// An internal failure with its cause.
    pub fn internal_from(
        what: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        ConvertError::Internal(ftpipe_fs::InternalError::with_source(what, source))
    }
}

impl From<ftpipe_fs::FsError> for ConvertError {
    fn from(e: ftpipe_fs::FsError) -> Self {
        match e {
            ftpipe_fs::FsError::Io(e) => ConvertError::Io(e),
            ftpipe_fs::FsError::InsufficientSpace(e) => ConvertError::InsufficientSpace(e),
        }
    }
}

/// Shorthand for results of this crate.
pub type Result<T, E = ConvertError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes() {
        assert_eq!(ConvertError::internal("x").class(), ErrorClass::Internal);
        let full = std::io::Error::from(std::io::ErrorKind::StorageFull);
        assert_eq!(
            ConvertError::io("write", "a.ftw", full).class(),
            ErrorClass::NoSpace
        );
        let read = ConvertError::SourceRead {
            file: "a".into(),
            tensor: "t".into(),
            offset: 0,
            source: std::io::ErrorKind::UnexpectedEof.into(),
        };
        assert_eq!(read.class(), ErrorClass::Failure);
        let preflight = ConvertError::from(ftpipe_fs::FsError::InsufficientSpace(
            ftpipe_fs::InsufficientSpace {
                volume: "v".into(),
                available: 1,
                needed: 2,
            },
        ));
        assert_eq!(preflight.class(), ErrorClass::NoSpace);
        let hub = ConvertError::Hub(ftpipe_hub::HubError::internal("x"));
        assert_eq!(hub.class(), ErrorClass::Internal);
        let artifact = ConvertError::Artifact(ftpipe_artifact::ArtifactError::io(
            "write",
            "m",
            std::io::ErrorKind::StorageFull.into(),
        ));
        assert_eq!(artifact.class(), ErrorClass::NoSpace);
        let input = ConvertError::MissingFile { file: "x".into() };
        assert_eq!(input.class(), ErrorClass::Failure);
        let recipe = ConvertError::Recipe(crate::RecipeError::NoRules { file: "r".into() });
        assert_eq!(recipe.class(), ErrorClass::Failure);
    }
}
