//! Errors of the durable store.

use std::path::PathBuf;

use ftpipe_fs::ErrorClass;

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
    /// Whether the volume holding the database is full: SQLite answered
    /// `SQLITE_FULL` (the WAL or the database file could not grow), or an
    /// I/O error with `ENOSPC` lies anywhere in the chain; at open and
    /// creation, during a migration, or at a write. The database lives on
    /// the target volume, so a full disk reaches the store too; callers
    /// report it as "no space" rather than as a database failure.
    pub fn is_disk_full(&self) -> bool {
        self.class() == ErrorClass::NoSpace
    }

    /// This error's [`ErrorClass`]: [`ErrorClass::NoSpace`] for a full disk
    /// (see [`StoreError::is_disk_full`]), [`ErrorClass::Failure`] for
    /// everything else (a refused or damaged state file names itself).
    ///
    /// The whole source chain is searched, not one variant's source: a
    /// migration wraps its `sqlx::Error` in a `MigrateError`, and a full
    /// disk there used to be missed (exit 1 instead of 5).
    pub fn class(&self) -> ErrorClass {
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(self);
        while let Some(e) = cause {
            if e.downcast_ref::<sqlx::Error>().is_some_and(sqlite_full) {
                return ErrorClass::NoSpace;
            }
            cause = e.source();
        }
        ErrorClass::of_chain(self)
    }
}

/// Whether SQLite reported `SQLITE_FULL` (primary result code 13, also as
/// the low byte of an extended code), or the driver met a full disk.
fn sqlite_full(e: &sqlx::Error) -> bool {
    const SQLITE_FULL: i64 = 13;
    match e {
        sqlx::Error::Database(db) => db
            .code()
            .and_then(|c| c.parse::<i64>().ok())
            .is_some_and(|c| c & 0xff == SQLITE_FULL),
        sqlx::Error::Io(e) => ErrorClass::of_io(e) == ErrorClass::NoSpace,
        _ => false,
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

#[cfg(test)]
mod tests {
    use super::*;
    use sqlx::migrate::MigrateError;

    fn full_io() -> sqlx::Error {
        sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::StorageFull))
    }

    /// Regression: a full disk met while migrating the state database
    /// exited 1, not 5: `is_disk_full` looked only at `Open` and `Query`,
    /// and a migration's error is a `MigrateError` around the `sqlx::Error`.
    #[test]
    fn a_full_disk_at_open_migration_and_write_is_no_space() {
        let open = StoreError::Open {
            path: "state.db".into(),
            source: full_io(),
        };
        assert_eq!(open.class(), ErrorClass::NoSpace);
        let migrate = StoreError::Migrate {
            path: "state.db".into(),
            source: MigrateError::Execute(full_io()),
        };
        assert_eq!(migrate.class(), ErrorClass::NoSpace);
        assert!(migrate.is_disk_full());
        let migration = StoreError::Migrate {
            path: "state.db".into(),
            source: MigrateError::ExecuteMigration(full_io(), 8),
        };
        assert_eq!(migration.class(), ErrorClass::NoSpace);
        let write = StoreError::Query {
            context: "insert attempt",
            source: full_io(),
        };
        assert_eq!(write.class(), ErrorClass::NoSpace);
        let unsafe_file = StoreError::Unsafe {
            path: "state.db-wal".into(),
            source: std::io::Error::from(std::io::ErrorKind::StorageFull),
        };
        assert_eq!(unsafe_file.class(), ErrorClass::NoSpace);
    }

    /// SQLite's own `SQLITE_FULL` (a database error, not an I/O one), met
    /// by a real database whose size is capped (`max_page_count`).
    #[tokio::test]
    async fn sqlite_full_from_a_capped_database_is_no_space() {
        use sqlx::Connection;
        let mut conn = sqlx::SqliteConnection::connect("sqlite::memory:")
            .await
            .unwrap();
        sqlx::query("CREATE TABLE t (x BLOB)")
            .execute(&mut conn)
            .await
            .unwrap();
        let pages: i64 = sqlx::query_scalar("PRAGMA page_count")
            .fetch_one(&mut conn)
            .await
            .unwrap();
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "PRAGMA max_page_count = {}",
            pages + 1
        )))
        .execute(&mut conn)
        .await
        .unwrap();
        let source = sqlx::query("INSERT INTO t VALUES (zeroblob(1000000))")
            .execute(&mut conn)
            .await
            .expect_err("the capped database is full");
        let write = StoreError::Query {
            context: "insert",
            source,
        };
        assert_eq!(write.class(), ErrorClass::NoSpace, "{write}");
        let migrate = StoreError::Migrate {
            path: "state.db".into(),
            source: MigrateError::Execute(match write {
                StoreError::Query { source, .. } => source,
                _ => unreachable!(),
            }),
        };
        assert_eq!(migrate.class(), ErrorClass::NoSpace, "{migrate}");
        let other = StoreError::Query {
            context: "select",
            source: sqlx::Error::RowNotFound,
        };
        assert_eq!(other.class(), ErrorClass::Failure);
        assert_eq!(
            StoreError::Integrity { report: "x".into() }.class(),
            ErrorClass::Failure
        );
    }
}
