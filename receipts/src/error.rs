//! Errors of the durable store.

use std::path::PathBuf;

/// Everything that can go wrong while reading or writing the state database.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database could not be opened or created.
    #[error("cannot open state database {path}: {source}")]
    Open {
        /// The database file.
        path: PathBuf,
        /// The SQLite error.
        #[source]
        source: sqlx::Error,
    },
    /// A state file is a link or not a regular file.
    #[error("refusing state database file {path}: {source}")]
    Unsafe {
        /// The refused file.
        path: PathBuf,
        /// The I/O error that describes why.
        #[source]
        source: std::io::Error,
    },
    /// A migration failed to apply.
    #[error("cannot migrate state database {path}: {source}")]
    Migrate {
        /// The database file.
        path: PathBuf,
        /// The migration error.
        #[source]
        source: sqlx::migrate::MigrateError,
    },
    /// A query failed.
    #[error("state database query failed ({context}): {source}")]
    Query {
        /// What the query was for.
        context: &'static str,
        /// The SQLite error.
        #[source]
        source: sqlx::Error,
    },
    /// A ledger row that must exist does not.
    #[error("no ledger row for {path}")]
    MissingLedger {
        /// The repo file whose ledger row is missing.
        path: String,
    },
    /// A range update that does not fit the file's stored ranges (no range
    /// starts at `start`, or `at` lies outside what it may move to).
    #[error("{path}: no range starting at {start} can take position {at}")]
    BadRange {
        /// The repo file.
        path: String,
        /// The range start the update named.
        start: u64,
        /// The position it tried to move to.
        at: u64,
    },
    /// A counter stored in SQLite is negative or does not fit in u64.
    #[error("corrupt counter {column} = {value} for {path}")]
    CorruptCounter {
        /// The repo file of the row.
        path: String,
        /// The column holding the counter.
        column: &'static str,
        /// The stored value.
        value: i64,
    },
    /// A byte count does not fit in SQLite's signed 64-bit integer.
    #[error("byte count {value} for {path} exceeds the database limit")]
    CounterOverflow {
        /// The repo file the count is for.
        path: String,
        /// The byte count.
        value: u64,
    },
    /// A stored name (stage, event) that this version does not know.
    #[error("unknown value {value:?} in {column}")]
    UnknownValue {
        /// The column holding it.
        column: &'static str,
        /// The unknown stored name.
        value: String,
    },
    /// `PRAGMA integrity_check` reported a problem.
    #[error("state database integrity check failed: {report}")]
    Integrity {
        /// What the integrity check reported.
        report: String,
    },
}

impl StoreError {
    /// Whether SQLite failed because the volume is full (`SQLITE_FULL`, e.g.
    /// the WAL or the database file could not grow). The database lives on
    /// the target volume, so a full disk reaches the store too; callers
    /// report it as "no space" rather than as a database failure.
    pub fn is_disk_full(&self) -> bool {
        const SQLITE_FULL: i64 = 13;
        let (StoreError::Open { source, .. } | StoreError::Query { source, .. }) = self else {
            return false;
        };
        match source {
            sqlx::Error::Database(db) => db
                .code()
                .and_then(|c| c.parse::<i64>().ok())
                .is_some_and(|c| c & 0xff == SQLITE_FULL),
            sqlx::Error::Io(e) => e.kind() == std::io::ErrorKind::StorageFull,
            _ => false,
        }
    }
}

/// Shorthand for results of this crate.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

pub(crate) trait QueryContext<T> {
    fn ctx(self, context: &'static str) -> Result<T>;
}

impl<T> QueryContext<T> for std::result::Result<T, sqlx::Error> {
    fn ctx(self, context: &'static str) -> Result<T> {
        self.map_err(|source| StoreError::Query { context, source })
    }
}
