//! Stage status as a pure function of the append-only event log.
//!
//! The same [`StageState::record`] is used when an event is appended live
//! and when the log is replayed, so the status a user sees is exactly what
//! the log says. An impossible `(state, event)` pair is an error.

use serde::Serialize;

use ftpipe_receipts::{RunId, Stage, StageEvent};

/// Where a stage stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum StageState {
    /// Never started.
    Pending,
    /// Started by `run` and not finished (or that run was killed).
    Running {
        /// The run that started it.
        run: RunId,
    },
    /// Last run completed it.
    Completed {
        /// The run that completed it.
        run: RunId,
    },
    /// Last run failed it.
    Failed {
        /// The run that failed it.
        run: RunId,
    },
}

impl std::fmt::Display for StageState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StageState::Pending => f.write_str("pending"),
            StageState::Running { run } => write!(
                f,
                "running since run {run} (or that run was interrupted: the same command resumes it)"
            ),
            StageState::Completed { run } => write!(f, "completed in run {run}"),
            StageState::Failed { run } => write!(f, "failed in run {run}"),
        }
    }
}

/// An event that cannot follow the current state.
#[derive(Debug, Clone, thiserror::Error)]
#[error("stage {stage}: event {event:?} of run {run} cannot follow {from:?}")]
pub struct IllegalTransition {
    /// The stage.
    pub stage: Stage,
    /// State before the event.
    pub from: StageState,
    /// The event.
    pub event: StageEvent,
    /// The run that appended it.
    pub run: RunId,
}

impl StageState {
    /// Applies one event. A new run may restart a stage in any state (a
    /// `Running` left by a killed run is thereby superseded); finishing is
    /// only legal for the run that started it.
    pub fn record(
        self,
        stage: Stage,
        event: StageEvent,
        run: RunId,
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
        next.ok_or(IllegalTransition {
            stage,
            from: self,
            event,
            run,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const F: Stage = Stage::Fetch;
    const R1: RunId = RunId::from_raw(1);
    const R2: RunId = RunId::from_raw(2);

    #[test]
    fn legal_and_illegal_transitions() {
        let s = StageState::Pending
            .record(F, StageEvent::Started, R1)
            .unwrap();
        assert!(s.record(F, StageEvent::Started, R1).is_err());
        let crashed_then_new = s.record(F, StageEvent::Started, R2).unwrap();
        assert!(
            crashed_then_new
                .record(F, StageEvent::Completed, R1)
                .is_err()
        );
        let done = crashed_then_new
            .record(F, StageEvent::Completed, R2)
            .unwrap();
        assert_eq!(done, StageState::Completed { run: R2 });
        assert!(done.record(F, StageEvent::Failed, R2).is_err());
        assert!(
            StageState::Pending
                .record(F, StageEvent::Completed, R1)
                .is_err()
        );
    }
}
