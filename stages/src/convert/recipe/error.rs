//! Errors of a recipe: each names the recipe file and the key, rule
//! (`rules[i]`, counted from 0) or `[[expect]]` table at fault, and what was
//! expected. Errors about the source checkpoint found while a recipe maps
//! it (a dtype, a missing tensor, an expert gap) are [`ConvertError`]s like
//! those of the built-in profiles.
//!
//! [`ConvertError`]: crate::convert::ConvertError

/// A recipe that cannot be used as written, or that the source contradicts.
#[derive(Debug, thiserror::Error)]
pub enum RecipeError {
    /// A recipe file exceeds [`MAX_RECIPE_BYTES`](super::MAX_RECIPE_BYTES).
    #[error("{file}: recipe of {len} bytes exceeds the limit of {limit} bytes")]
    TooLarge { file: String, len: u64, limit: u64 },
    /// A recipe is not valid TOML of the recipe schema (syntax, unknown or
    /// missing key, wrong type). `message` starts with the line and column
    /// when the parser knows them. The parser's error is not kept as the
    /// source: its text is a multi-line excerpt of the file, and its message
    /// and position are what `message` holds.
    #[error("{file}: {message}")]
    Syntax { file: String, message: String },
    /// More `[[expect]]` tables than [`MAX_EXPECT_TABLES`](super::MAX_EXPECT_TABLES).
    #[error("{file}: {count} [[expect]] tables exceed the limit of {limit}")]
    TooManyExpects {
        file: String,
        count: usize,
        limit: usize,
    },
    /// `model_type` or `name` is not a usable name.
    #[error("{file}: {field} {value:?} {problem}")]
    BadName {
        file: String,
        field: String,
        value: String,
        problem: String,
    },
    /// An `[[expect]]` table is malformed.
    #[error("{file}: expect[{index}]: {problem}")]
    BadExpect {
        file: String,
        index: usize,
        problem: String,
    },
    /// Source tensors disagree with the `[[expect]]` tables: one line per
    /// tensor (`FILE: TENSOR: expected …, found …`).
    #[error(
        "{count} tensor(s) disagree with the [[expect]] tables of recipe {recipe} ({file}):\n{problems}"
    )]
    Contract {
        file: String,
        recipe: String,
        count: usize,
        problems: String,
    },
    /// The recipe has no rules.
    #[error("{file}: the recipe has no [[rules]]; every tensor must be placed by a rule")]
    NoRules { file: String },
    /// More rules than [`MAX_RECIPE_RULES`](super::MAX_RECIPE_RULES).
    #[error("{file}: {count} rules exceed the limit of {limit}")]
    TooManyRules {
        file: String,
        count: usize,
        limit: usize,
    },
    /// A rule's glob is empty or too long.
    #[error("{file}: rules[{rule}]: glob {glob:?} {problem}")]
    BadGlob {
        file: String,
        rule: usize,
        glob: String,
        problem: String,
    },
    /// A rule's glob does not compile.
    #[error("{file}: rules[{rule}]: glob {glob:?} is invalid: {source}")]
    InvalidGlob {
        file: String,
        rule: usize,
        glob: String,
        #[source]
        source: Box<globset::Error>,
    },
    /// The rules' globs compile one by one but not as one set.
    #[error("{file}: the rules' globs do not compile together: {source}")]
    GlobSet {
        file: String,
        #[source]
        source: globset::Error,
    },
    /// A rule's `component` is not one the recipe format knows.
    #[error(
        "{file}: rules[{rule}]: component {value:?} is not \"ftw\" or \"experts\" (there is no skip: every tensor must land in a component)"
    )]
    BadComponent {
        file: String,
        rule: usize,
        value: String,
    },
    /// A rule's `dtype` is not one the recipe format knows.
    #[error("{file}: rules[{rule}]: dtype {value:?} is not \"keep\" or \"protected\"")]
    BadDtype {
        file: String,
        rule: usize,
        value: String,
    },
    /// The recipe was written for another `model_type` than the config's.
    #[error(
        "{file}: the recipe is for model_type {recipe:?}, but config.json has model_type {config:?}"
    )]
    ModelType {
        file: String,
        recipe: String,
        config: String,
    },
    /// A rule places no tensor (a typo, or shadowed by earlier rules).
    #[error(
        "{file}: rules[{rule}] (glob {glob:?}) places no tensor of the source: it matches none, or only tensors an earlier rule already places"
    )]
    RuleUnused {
        file: String,
        rule: usize,
        glob: String,
    },
    /// A rule asks to protect a tensor the source stores as NVFP4.
    #[error(
        "{file}: tensor {tensor} is stored quantized (NVFP4), but rules[{rule}] (glob {glob:?}) asks for dtype = \"protected\""
    )]
    ProtectedQuantized {
        file: String,
        tensor: String,
        rule: usize,
        glob: String,
    },
    /// A tensor an `experts` rule matched has no layer/expert/field in its name.
    #[error(
        "{file}: tensor {tensor} matched by rules[{rule}] (glob {glob:?}, component \"experts\"): {problem}"
    )]
    ExpertName {
        file: String,
        tensor: String,
        rule: usize,
        glob: String,
        problem: String,
    },
}
