//! The typed values the state database stores as text: run ids, stage
//! names and the events of the append-only logs. Each enum's stored name is
//! fixed data (a migration's `CHECK` lists the same names); a name the code
//! does not know is [`StoreError::UnknownValue`], never a silent default.

use serde::Serialize;

use crate::error::StoreError;

/// Identifier of one invocation of ftpipe (a row of `runs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, sqlx::Type)]
#[serde(transparent)]
#[sqlx(transparent)]
pub struct RunId(i64);

impl RunId {
    /// The id as SQLite stores it.
    pub const fn get(self) -> i64 {
        self.0
    }

    /// A run id read from elsewhere (a test, a report).
    pub const fn from_raw(id: i64) -> RunId {
        RunId(id)
    }
}

impl std::fmt::Display for RunId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// Declares an enum stored as text: each variant with its stored name.
macro_rules! stored_enum {
    ($(#[$meta:meta])* $name:ident, $column:literal { $($(#[$vmeta:meta])* $variant:ident = $text:literal,)+ }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
        #[serde(rename_all = "snake_case")]
        pub enum $name {
            $($(#[$vmeta])* $variant,)+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant,)+];

            /// The name stored in the database.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)+
                }
            }

            /// Parses a stored name.
            pub fn parse(s: &str) -> Result<$name, StoreError> {
                match s {
                    $($text => Ok($name::$variant),)+
                    _ => Err(StoreError::UnknownValue {
                        column: $column,
                        value: s.to_owned(),
                    }),
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.pad(self.as_str())
            }
        }
    };
}

stored_enum! {
    /// The stages of a run, in their fixed order.
    Stage, "stage_events.stage" {
        /// Pin the revision to a commit and store the listing.
        Resolve = "resolve",
        /// Plan the conversion from published sources or remote headers.
        Plan = "plan",
        /// Download, verify and publish the selected files.
        Fetch = "fetch",
        /// Write the artifact.
        Convert = "convert",
        /// Check the artifact on its own, as a receiver would.
        Verify = "verify",
    }
}

stored_enum! {
    /// An event on a stage.
    StageEvent, "stage_events.event" {
        /// A run began the stage.
        Started = "started",
        /// The stage finished successfully.
        Completed = "completed",
        /// The stage failed (the detail says why).
        Failed = "failed",
    }
}

stored_enum! {
    /// An event of the source-retirement log.
    RetirementEvent, "source_retirements.event" {
        /// The source was unlinked (and its directory fsynced) after every
        /// component reading it had a receipt.
        Retired = "retired",
        /// The source is about to be fetched again.
        Reacquired = "reacquired",
    }
}

stored_enum! {
    /// An event of the artifact log.
    ArtifactEvent, "artifacts.event" {
        /// A manifest was written and fsynced.
        Manifest = "manifest",
        /// A stale artifact was moved aside.
        SetAside = "set_aside",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_names_round_trip_and_unknown_names_are_errors() {
        for s in Stage::ALL {
            assert_eq!(Stage::parse(s.as_str()).unwrap(), *s);
        }
        for e in StageEvent::ALL {
            assert_eq!(StageEvent::parse(e.as_str()).unwrap(), *e);
        }
        for e in RetirementEvent::ALL {
            assert_eq!(RetirementEvent::parse(e.as_str()).unwrap(), *e);
        }
        for e in ArtifactEvent::ALL {
            assert_eq!(ArtifactEvent::parse(e.as_str()).unwrap(), *e);
        }
        let err = Stage::parse("Fetch").unwrap_err();
        assert!(err.to_string().contains("stage_events.stage"), "{err}");
    }

    #[test]
    fn stages_keep_their_order() {
        let names: Vec<_> = Stage::ALL.iter().map(|s| s.as_str()).collect();
        assert_eq!(names, ["resolve", "plan", "fetch", "convert", "verify"]);
    }
}
