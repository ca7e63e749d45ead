//! Stage status as a pure function of the append-only event log.
//!
//! The same [`StageState::record`] is used when an event is appended live
//! and when the log is replayed, so the status a user sees is exactly what
//! the log says. An impossible `(state, event)` pair is an error.

use serde::Serialize;

/// Stages in their fixed order.
pub const STAGES: &[&str] = &["resolve", "plan", "fetch", "convert", "verify"];

/// An event on a stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StageEvent {
    /// A run began the stage.
    Started,
    /// The stage finished successfully.
    Completed,
    /// The stage failed (the detail says why).
    Failed,
}

impl StageEvent {
    /// Name stored in the log.
    pub fn as_str(self) -> &'static str {
        match self {
            StageEvent::Started => "started",
            StageEvent::Completed => "completed",
            StageEvent::Failed => "failed",
        }
    }

    /// Parses a stored name.
    pub fn parse(s: &str) -> Option<StageEvent> {
        match s {
            "started" => Some(StageEvent::Started),
            "completed" => Some(StageEvent::Completed),
            "failed" => Some(StageEvent::Failed),
            _ => None,
        }
    }
}

/// Where a stage stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum StageState {
    /// Never started.
    Pending,
    /// Started by `run` and not finished (or that run was killed).
    Running { run: i64 },
    /// Last run completed it.
    Completed { run: i64 },
    /// Last run failed it.
    Failed { run: i64 },
}

/// An event that cannot follow the current state.
#[derive(Debug, Clone, thiserror::Error)]
#[error("stage {stage}: event {event:?} of run {run} cannot follow {from:?}")]
pub struct IllegalTransition {
    /// Stage name.
    pub stage: String,
    /// State before the event.
    pub from: StageState,
    /// The event.
    pub event: StageEvent,
    /// The run that appended it.
    pub run: i64,
}

impl StageState {
    /// Applies one event. A new run may restart a stage in any state (a
    /// `Running` left by a killed run is thereby superseded); finishing is
    /// only legal for the run that started it.
    pub fn record(
        self,
        stage: &str,
        event: StageEvent,
        run: i64,
    ) -> Result<StageState, IllegalTransition> {
        use StageEvent as E;
        use StageState as S;
        let next = match (self, event) {
            (S::Pending | S::Completed { .. } | S::Failed { .. }, E::Started) => {
                Some(S::Running { run })
            }
            (S::Running { run: r }, E::Started) if r != run => Some(S::Running { run }),
            (S::Running { run: r }, E::Completed) if r == run => Some(S::Completed { run }),
            (S::Running { run: r }, E::Failed) if r == run => Some(S::Failed { run }),
            _ => None,
        };
        next.ok_or_else(|| IllegalTransition {
            stage: stage.to_owned(),
            from: self,
            event,
            run,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn legal_and_illegal_transitions() {
        let s = StageState::Pending
            .record("fetch", StageEvent::Started, 1)
            .unwrap();
        assert!(s.record("fetch", StageEvent::Started, 1).is_err());
        let crashed_then_new = s.record("fetch", StageEvent::Started, 2).unwrap();
        assert!(
            crashed_then_new
                .record("fetch", StageEvent::Completed, 1)
                .is_err()
        );
        let done = crashed_then_new
            .record("fetch", StageEvent::Completed, 2)
            .unwrap();
        assert_eq!(done, StageState::Completed { run: 2 });
        assert!(done.record("fetch", StageEvent::Failed, 2).is_err());
        assert!(
            StageState::Pending
                .record("fetch", StageEvent::Completed, 1)
                .is_err()
        );
    }
}
