//! How an upload is cut into parts and how many go at once: the user's
//! `--part-size` / `--concurrency` when given, else chosen from the
//! object's size within the target's limits ([`PartRules`]; S3: parts of
//! at least 5 MiB, at most 10,000 of them, none above 5 GiB).
//!
//! The choice follows what the well-kept clients do. awscli and the AWS
//! CRT client start from 8 MiB parts and grow them only when an object
//! would need more than 10,000; s5cmd sends 50 MiB parts, 5 at a time.
//! Here a part is 1/[`TARGET_PARTS`] of the object rounded up to a power
//! of two, within [`MIN_AUTO_PART`]..=[`MAX_AUTO_PART`]: small objects
//! keep the 8 MiB parts (enough parts to keep several in flight), large
//! ones get parts like s5cmd's, so each part's fixed cost (a request, its
//! attempt rows and the part's receipt committed to `state.db`) is paid
//! a few dozen times per object, not hundreds. Past 10,000 parts the part
//! grows to the smallest whole MiB that fits.
//!
//! Parts in flight: as many as fit in [`IN_FLIGHT_BYTES`] of memory
//! (every part in flight is held whole; one more, the next, is read ahead
//! while they are sent, and the file's digest, which runs behind the
//! sends, may still hold one sent part), at least [`MIN_AUTO_CONCURRENCY`]
//! and at most [`MAX_AUTO_CONCURRENCY`], never more than the object's
//! parts. Multipart files go one after another (one file's parts fill the
//! link) while the files small enough for one put go several at once
//! beside them (`publish::upload_all`), so the count of objects enters
//! only there: many small objects are not sent one round trip after
//! another.
//!
//! A resumed session keeps the part size it was started with (its upload
//! row holds it): the choice is made only for a new session.

use ftpipe_objstore::PartRules;

/// Parts an object is cut into when its size decides the part size.
pub const TARGET_PARTS: u64 = 32;
/// Smallest part size chosen without `--part-size` (awscli's and the CRT
/// client's default part).
pub const MIN_AUTO_PART: u64 = 8 * MIB;
/// Largest part size chosen without `--part-size`, unless the part count
/// limit needs more.
pub const MAX_AUTO_PART: u64 = 64 * MIB;
/// Largest part S3 accepts.
pub const MAX_PART_SIZE: u64 = 5 * 1024 * MIB;
/// Bytes of parts held in memory at once, at most (unless
/// [`MIN_AUTO_CONCURRENCY`] parts are larger).
pub const IN_FLIGHT_BYTES: u64 = 256 * MIB;
/// Fewest parts in flight chosen for a multipart object.
pub const MIN_AUTO_CONCURRENCY: usize = 2;
/// Most parts in flight chosen without `--concurrency`.
pub const MAX_AUTO_CONCURRENCY: usize = 8;

const MIB: u64 = 1024 * 1024;

/// What the user asked for; `None`: chosen per object.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PartChoice {
    /// `--part-size`.
    pub part_size: Option<u64>,
    /// `--concurrency`.
    pub concurrency: Option<usize>,
}

/// How one object is uploaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartPlan {
    /// Size of every part but the last; an object of at most this many
    /// bytes goes in one put.
    pub part_size: u64,
    /// Parts in flight at once (1 for a target whose parts arrive in
    /// order).
    pub concurrency: usize,
}

/// Parts of an object of `size` bytes cut at `part_size` (at least 1; an
/// empty object is one empty part).
pub fn parts_of(size: u64, part_size: u64) -> u64 {
    size.div_ceil(part_size.max(1)).max(1)
}

/// The plan for an object of `size` bytes on a target with `rules`, the
/// user's `choice` winning where given. The part size never gives more
/// than `rules.max_parts` parts (a user's part size too small for that
/// grows to the smallest one that fits, as before); an object too large
/// for the target at its largest part is left to the target to refuse.
pub fn plan(size: u64, rules: &PartRules, choice: PartChoice) -> PartPlan {
    let fits_count = size.div_ceil(rules.max_parts.max(1));
    let part_size = match choice.part_size {
        Some(p) => p.max(fits_count),
        None => auto_part_size(size, rules, fits_count),
    }
    .max(1);
    let concurrency = if rules.in_order {
        1
    } else {
        match choice.concurrency {
            Some(c) => c,
            None => auto_concurrency(parts_of(size, part_size), part_size),
        }
    }
    .max(1);
    PartPlan {
        part_size,
        concurrency,
    }
}

/// 1/[`TARGET_PARTS`] of `size` as a power of two within the automatic
/// bounds and the target's minimum; grown to whole MiB when the part count
/// limit needs `fits_count` bytes a part.
fn auto_part_size(size: u64, rules: &PartRules, fits_count: u64) -> u64 {
    let by_count = size
        .div_ceil(TARGET_PARTS)
        .checked_next_power_of_two()
        .unwrap_or(MAX_AUTO_PART)
        .clamp(MIN_AUTO_PART, MAX_AUTO_PART)
        .max(rules.min_part_size);
    if by_count >= fits_count {
        return by_count;
    }
    fits_count
        .div_ceil(MIB)
        .saturating_mul(MIB)
        .min(MAX_PART_SIZE)
        .max(fits_count)
}

/// Parts in flight for `parts` parts of `part_size` bytes.
fn auto_concurrency(parts: u64, part_size: u64) -> usize {
    let by_memory = usize::try_from(IN_FLIGHT_BYTES / part_size.max(1)).unwrap_or(usize::MAX);
    let by_parts = usize::try_from(parts).unwrap_or(usize::MAX);
    by_memory
        .clamp(MIN_AUTO_CONCURRENCY, MAX_AUTO_CONCURRENCY)
        .min(by_parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S3: PartRules = PartRules {
        min_part_size: 5 * MIB,
        max_parts: 10_000,
        in_order: false,
    };
    const AUTO: PartChoice = PartChoice {
        part_size: None,
        concurrency: None,
    };
    const GIB: u64 = 1024 * MIB;
    const TIB: u64 = 1024 * GIB;

    fn auto(size: u64) -> PartPlan {
        plan(size, &S3, AUTO)
    }

    #[test]
    fn an_empty_or_small_object_is_one_put_of_the_smallest_auto_part() {
        assert_eq!(
            auto(0),
            PartPlan {
                part_size: MIN_AUTO_PART,
                concurrency: 1
            }
        );
        assert_eq!(parts_of(0, auto(0).part_size), 1);
        // 5 MiB: S3's minimum part, below the 8 MiB part: one put.
        let p = auto(5 * MIB);
        assert_eq!(
            (p.part_size, parts_of(5 * MIB, p.part_size), p.concurrency),
            (8 * MIB, 1, 1)
        );
        // Exactly one part's worth is still one put; a byte more is two.
        assert_eq!(parts_of(8 * MIB, auto(8 * MIB).part_size), 1);
        let p = auto(8 * MIB + 1);
        assert_eq!(
            (
                p.part_size,
                parts_of(8 * MIB + 1, p.part_size),
                p.concurrency
            ),
            (8 * MIB, 2, 2)
        );
    }

    #[test]
    fn the_part_grows_with_the_object_up_to_the_auto_maximum() {
        // Up to 32 × 8 MiB the part stays 8 MiB, with 8 in flight.
        let p = auto(256 * MIB);
        assert_eq!(
            (p.part_size, parts_of(256 * MIB, p.part_size), p.concurrency),
            (8 * MIB, 32, 8)
        );
        // Then a power of two a 32nd of the object: the bench's 1.75 GB
        // artifact's big file gets 64 MiB parts, 4 in flight (256 MiB).
        let p = auto(1_750_000_000);
        assert_eq!(
            (
                p.part_size,
                parts_of(1_750_000_000, p.part_size),
                p.concurrency
            ),
            (64 * MIB, 27, 4)
        );
        let p = auto(600 * MIB);
        assert_eq!((p.part_size, p.concurrency), (32 * MIB, 8));
        // Beyond 32 × 64 MiB the part stays 64 MiB.
        assert_eq!(auto(100 * GIB).part_size, 64 * MIB);
    }

    #[test]
    fn the_ten_thousand_part_limit_grows_the_part_to_whole_mib() {
        // 10,000 parts of 64 MiB exactly: still 64 MiB parts.
        let edge = 10_000 * 64 * MIB;
        let p = auto(edge);
        assert_eq!(
            (p.part_size, parts_of(edge, p.part_size)),
            (64 * MIB, 10_000)
        );
        // One byte more needs 65 MiB parts.
        let p = auto(edge + 1);
        assert_eq!(p.part_size, 65 * MIB);
        assert!(parts_of(edge + 1, p.part_size) <= 10_000);
        // S3's largest object, 5 TiB: 525 MiB parts (the smallest whole
        // MiB giving at most 10,000), 2 in flight.
        let p = auto(5 * TIB);
        assert_eq!((p.part_size, p.concurrency), (525 * MIB, 2));
        assert_eq!(parts_of(5 * TIB, p.part_size), 9_987);
        assert!(p.part_size <= MAX_PART_SIZE);
    }

    #[test]
    fn the_users_choice_wins_within_the_part_count_limit() {
        let given = PartChoice {
            part_size: Some(256 * 1024),
            concurrency: Some(3),
        };
        assert_eq!(
            plan(100 * MIB, &S3, given),
            PartPlan {
                part_size: 256 * 1024,
                concurrency: 3
            }
        );
        // A given part size too small for 10,000 parts grows just enough.
        let p = plan(5 * TIB, &S3, given);
        assert_eq!(p.part_size, (5 * TIB).div_ceil(10_000));
        assert_eq!(parts_of(5 * TIB, p.part_size), 10_000);
        // Only the concurrency given: the part size is still chosen.
        let c = PartChoice {
            part_size: None,
            concurrency: Some(16),
        };
        assert_eq!(plan(1_750_000_000, &S3, c).part_size, 64 * MIB);
        assert_eq!(plan(1_750_000_000, &S3, c).concurrency, 16);
        // Only the part size given: the concurrency follows it.
        let p = PartChoice {
            part_size: Some(128 * MIB),
            concurrency: None,
        };
        assert_eq!(plan(GIB, &S3, p).concurrency, 2);
    }

    #[test]
    fn a_target_taking_parts_in_order_gets_one_at_a_time() {
        let registry = PartRules {
            min_part_size: 1,
            max_parts: u64::MAX,
            in_order: true,
        };
        assert_eq!(plan(GIB, &registry, AUTO).concurrency, 1);
        let given = PartChoice {
            part_size: None,
            concurrency: Some(8),
        };
        assert_eq!(plan(GIB, &registry, given).concurrency, 1);
        assert_eq!(plan(GIB, &registry, AUTO).part_size, 32 * MIB);
    }
}
