//! What kind of failure an error is, as one answer every error type of
//! ftpipe gives: [`ErrorClass`].
//!
//! Why here: the binary maps a failure to an exit code (README, Exit
//! codes), and used to do so by matching the variants of every crate's
//! error by hand, looking through their wrappers. That missed what the
//! match forgot: a full disk met while migrating the state database exited
//! 1, and two panicked fetch tasks (an aggregate whose parts were not
//! looked into) exited 1 where one exited 7. Now each error type says its
//! own class, wrappers and aggregates ask their parts, and the binary
//! maps a class to a code in one place. This crate is the lowest one every
//! error crate depends on, so the class lives here.

use std::error::Error;
use std::io;

/// The kind of a failure, ordered by severity: the derived order (`Ord`)
/// puts the most severe last, so an aggregate of several failures takes
/// the [`Ord::max`] of its parts' classes.
///
/// The order answers "two files failed differently: what should the exit
/// code say?" — the class that most changes what the user must do next,
/// and the one a re-run cannot cure by itself, wins:
///
/// 1. [`Internal`](ErrorClass::Internal): a bug. It may be why the other
///    parts failed, nothing about the run can be trusted to be the user's
///    to fix, and it must be reported; so it outranks everything.
/// 2. [`NoSpace`](ErrorClass::NoSpace): the target volume is full. Every
///    file on it stops, a re-run fails the same way until space is freed,
///    and a full disk often makes other parts fail in ways that look
///    unrelated (a short write, a failed ledger update).
/// 3. [`Locked`](ErrorClass::Locked): another ftpipe works on `DIR`;
///    nothing of this run did anything. It rarely meets another class, but
///    when it does it explains the rest.
/// 4. [`Verification`](ErrorClass::Verification): bytes on disk do not
///    match what was pinned or recorded. Serious about the data, but it is
///    about one file and a re-run (or `verify`) deals with it, so a full
///    disk or a bug beside it says more.
/// 5. [`Failure`](ErrorClass::Failure): everything else — bad input (a
///    glob, a recipe, a malformed source), a refused or broken network
///    request, a conflict on disk. The message names what to fix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ErrorClass {
    /// Bad input, a network or hub failure, a conflict on disk: anything
    /// the message itself tells the user how to fix (exit 1).
    Failure,
    /// Bytes do not match what was pinned or recorded (exit 6).
    Verification,
    /// Another ftpipe holds the lock on the directory (exit 3).
    Locked,
    /// The target volume is full, found by a preflight or by a write
    /// anywhere: fetch, conversion, the state database (exit 5).
    NoSpace,
    /// A broken invariant or a panicked task: a bug (exit 7).
    Internal,
}

impl ErrorClass {
    /// The class of an I/O error: [`ErrorClass::NoSpace`] for a full disk
    /// (`ENOSPC` is [`io::ErrorKind::StorageFull`]; a full quota,
    /// `EDQUOT`, is [`io::ErrorKind::QuotaExceeded`] and needs the same
    /// remedy), also when it wraps another error that is one;
    /// [`ErrorClass::Failure`] otherwise.
    pub fn of_io(e: &io::Error) -> ErrorClass {
        match e.kind() {
            io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded => ErrorClass::NoSpace,
            _ => match e.get_ref() {
                // `io::Error::source` skips the error it wraps (its text is
                // the io error's own), so look at that one here.
                Some(inner) => ErrorClass::of_chain(inner),
                None => ErrorClass::Failure,
            },
        }
    }

    /// The most severe class any I/O error in `err`'s source chain (`err`
    /// included) has: [`ErrorClass::NoSpace`] if a full disk is anywhere
    /// in it, else [`ErrorClass::Failure`]. An error type's `class` takes
    /// the max of this and its own variant's class, so a full disk deep in
    /// a cause (a database driver's, a task's) is never lost.
    pub fn of_chain(err: &(dyn Error + 'static)) -> ErrorClass {
        let mut class = ErrorClass::Failure;
        let mut cause = Some(err);
        while let Some(e) = cause {
            if let Some(io) = e.downcast_ref::<io::Error>() {
                class = class.max(ErrorClass::of_io(io));
            }
            cause = e.source();
        }
        class
    }

    /// The most severe of `classes` (an aggregate's class), or
    /// [`ErrorClass::Failure`] when there is none.
    pub fn worst(classes: impl IntoIterator<Item = ErrorClass>) -> ErrorClass {
        classes.into_iter().max().unwrap_or(ErrorClass::Failure)
    }
}

impl crate::FsError {
    /// This error's [`ErrorClass`]: a failed preflight or a full disk met
    /// by an operation is [`ErrorClass::NoSpace`], any other I/O failure
    /// [`ErrorClass::Failure`].
    pub fn class(&self) -> ErrorClass {
        match self {
            crate::FsError::Io(e) => e.class(),
            crate::FsError::InsufficientSpace(_) => ErrorClass::NoSpace,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FsError;

    #[test]
    fn the_order_is_the_documented_severity() {
        use ErrorClass::*;
        let ordered = [Failure, Verification, Locked, NoSpace, Internal];
        for pair in ordered.windows(2) {
            assert!(pair[0] < pair[1], "{:?} < {:?}", pair[0], pair[1]);
        }
        assert_eq!(
            ErrorClass::worst([Verification, Internal, NoSpace]),
            Internal
        );
        assert_eq!(ErrorClass::worst([Failure, NoSpace, Verification]), NoSpace);
        assert_eq!(ErrorClass::worst([]), Failure);
    }

    #[test]
    fn a_full_disk_anywhere_in_an_io_error_is_no_space() {
        let full = io::Error::from(io::ErrorKind::StorageFull);
        assert_eq!(ErrorClass::of_io(&full), ErrorClass::NoSpace);
        let quota = io::Error::from(io::ErrorKind::QuotaExceeded);
        assert_eq!(ErrorClass::of_io(&quota), ErrorClass::NoSpace);
        let enospc = io::Error::from_raw_os_error(28);
        assert_eq!(ErrorClass::of_io(&enospc), ErrorClass::NoSpace);
        // Wrapped in another io::Error, whose `source()` skips it.
        let wrapped = io::Error::other(io::Error::from(io::ErrorKind::StorageFull));
        assert_eq!(ErrorClass::of_io(&wrapped), ErrorClass::NoSpace);
        let denied = io::Error::from(io::ErrorKind::PermissionDenied);
        assert_eq!(ErrorClass::of_io(&denied), ErrorClass::Failure);

        let fs = FsError::io("write", "x", io::Error::from(io::ErrorKind::StorageFull));
        assert_eq!(fs.class(), ErrorClass::NoSpace);
        assert_eq!(ErrorClass::of_chain(&fs), ErrorClass::NoSpace);
        let fs = FsError::io("write", "x", io::Error::from(io::ErrorKind::NotFound));
        assert_eq!(fs.class(), ErrorClass::Failure);
        let preflight = FsError::InsufficientSpace(crate::InsufficientSpace {
            volume: "v".into(),
            available: 1,
            needed: 2,
        });
        assert_eq!(preflight.class(), ErrorClass::NoSpace);
    }
}
