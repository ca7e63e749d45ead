//! Errors of a recipe: each names the recipe file and the key, rule
//! (`rules[i]`, counted from 0) or `[[expect]]` table at fault, and what was
//! expected. Errors about the source checkpoint found while a recipe maps
//! it (a dtype, a missing tensor, an expert gap) are [`ConvertError`]s like
//! those of the built-in profiles.
//!
//! [`ConvertError`]: crate::ConvertError

/// A recipe that cannot be used as written, or that the source contradicts.
#[derive(Debug, thiserror::Error)]
pub enum RecipeError {
    /// A recipe file exceeds [`MAX_RECIPE_BYTES`](super::MAX_RECIPE_BYTES).
    #[error("{file}: recipe of {len} bytes exceeds the limit of {limit} bytes")]
    TooLarge {
        /// The recipe file.
        file: String,
        /// The recipe's size in bytes.
        len: u64,
        /// The largest size accepted, in bytes.
        limit: u64,
    },
    /// A recipe is not valid TOML of the recipe schema (syntax, unknown or
    /// missing key, wrong type). `message` starts with the line and column
    /// when the parser knows them. The parser's error is not kept as the
    /// source: its text is a multi-line excerpt of the file, and its message
    /// and position are what `message` holds.
    #[error("{file}: {message}")]
    Syntax {
        /// The recipe file.
        file: String,
        /// The parser's message, prefixed with line and column when known.
        message: String,
    },
    /// More `[[expect]]` tables than [`MAX_EXPECT_TABLES`](super::MAX_EXPECT_TABLES).
    #[error("{file}: {count} [[expect]] tables exceed the limit of {limit}")]
    TooManyExpects {
        /// The recipe file.
        file: String,
        /// How many `[[expect]]` tables the recipe has.
        count: usize,
        /// The most `[[expect]]` tables accepted.
        limit: usize,
    },
    /// `model_type` or `name` is not a usable name.
    #[error("{file}: {field} {value:?} {problem}")]
    BadName {
        /// The recipe file.
        file: String,
        /// The key at fault (`model_type` or `name`).
        field: String,
        /// The value the recipe gives.
        value: String,
        /// Why the value is not a usable name.
        problem: String,
    },
    /// An `[[expect]]` table is malformed.
    #[error("{file}: expect[{index}]: {problem}")]
    BadExpect {
        /// The recipe file.
        file: String,
        /// Index of the `[[expect]]` table, counted from 0.
        index: usize,
        /// What is wrong with the table.
        problem: String,
    },
    /// Source tensors disagree with the `[[expect]]` tables: one line per
    /// tensor (`FILE: TENSOR: expected …, found …`).
    #[error(
        "{count} tensor(s) disagree with the [[expect]] tables of recipe {recipe} ({file}):\n{problems}"
    )]
    Contract {
        /// The recipe file.
        file: String,
        /// The recipe's name.
        recipe: String,
        /// How many tensors disagree.
        count: usize,
        /// Every disagreement, one per line.
        problems: String,
    },
    /// The recipe has no rules.
    #[error("{file}: the recipe has no [[rules]]; every tensor must be placed by a rule")]
    NoRules {
        /// The recipe file.
        file: String,
    },
    /// More rules than [`MAX_RECIPE_RULES`](super::MAX_RECIPE_RULES).
    #[error("{file}: {count} rules exceed the limit of {limit}")]
    TooManyRules {
        /// The recipe file.
        file: String,
        /// How many rules the recipe has.
        count: usize,
        /// The most rules accepted.
        limit: usize,
    },
    /// A rule's glob is empty or too long.
    #[error("{file}: rules[{rule}]: glob {glob:?} {problem}")]
    BadGlob {
        /// The recipe file.
        file: String,
        /// Index of the rule, counted from 0.
        rule: usize,
        /// The rule's glob.
        glob: String,
        /// Why the glob cannot be used.
        problem: String,
    },
    /// A rule's glob does not compile.
    #[error("{file}: rules[{rule}]: glob {glob:?} is invalid: {source}")]
    InvalidGlob {
        /// The recipe file.
        file: String,
        /// Index of the rule, counted from 0.
        rule: usize,
        /// The rule's glob.
        glob: String,
        /// The glob compiler's error.
        #[source]
        source: Box<globset::Error>,
    },
    /// The rules' globs compile one by one but not as one set.
    #[error("{file}: the rules' globs do not compile together: {source}")]
    GlobSet {
        /// The recipe file.
        file: String,
        /// The glob set builder's error.
        #[source]
        source: globset::Error,
    },
    /// A rule's `component` is not one the recipe format knows.
    #[error(
        "{file}: rules[{rule}]: component {value:?} is not \"ftw\" or \"experts\" (there is no skip: every tensor must land in a component)"
    )]
    BadComponent {
        /// The recipe file.
        file: String,
        /// Index of the rule, counted from 0.
        rule: usize,
        /// The `component` the rule gives.
        value: String,
    },
    /// A rule's `dtype` is not one the recipe format knows.
    #[error("{file}: rules[{rule}]: dtype {value:?} is not \"keep\" or \"protected\"")]
    BadDtype {
        /// The recipe file.
        file: String,
        /// Index of the rule, counted from 0.
        rule: usize,
        /// The `dtype` the rule gives.
        value: String,
    },
    /// The recipe was written for another `model_type` than the config's.
    #[error(
        "{file}: the recipe is for model_type {recipe:?}, but config.json has model_type {config:?}"
    )]
    ModelType {
        /// The recipe file.
        file: String,
        /// The `model_type` the recipe is for.
        recipe: String,
        /// The `model_type` config.json gives.
        config: String,
    },
    /// A rule places no tensor (a typo, or shadowed by earlier rules).
    #[error(
        "{file}: rules[{rule}] (glob {glob:?}) places no tensor of the source: it matches none, or only tensors an earlier rule already places"
    )]
    RuleUnused {
        /// The recipe file.
        file: String,
        /// Index of the rule, counted from 0.
        rule: usize,
        /// The rule's glob.
        glob: String,
    },
    /// A rule asks to protect a tensor the source stores as NVFP4.
    #[error(
        "{file}: tensor {tensor} is stored quantized (NVFP4), but rules[{rule}] (glob {glob:?}) asks for dtype = \"protected\""
    )]
    ProtectedQuantized {
        /// The recipe file.
        file: String,
        /// The NVFP4 tensor the rule asks to protect.
        tensor: String,
        /// Index of the rule, counted from 0.
        rule: usize,
        /// The rule's glob.
        glob: String,
    },
    /// A tensor an `experts` rule matched has no layer/expert/field in its name.
    #[error(
        "{file}: tensor {tensor} matched by rules[{rule}] (glob {glob:?}, component \"experts\"): {problem}"
    )]
    ExpertName {
        /// The recipe file.
        file: String,
        /// The tensor the rule matched.
        tensor: String,
        /// Index of the rule, counted from 0.
        rule: usize,
        /// The rule's glob.
        glob: String,
        /// What its name lacks.
        problem: String,
    },
}

impl RecipeError {
    /// Always [`ErrorClass::Failure`](ftpipe_fs::ErrorClass::Failure): a
    /// recipe is input, and its message names the key or rule to fix.
    pub fn class(&self) -> ftpipe_fs::ErrorClass {
        ftpipe_fs::ErrorClass::Failure
    }
}
