//! How much space a conversion still needs, for the preflights of `run`'s
//! plan stage and of the convert stage (one computation for both).
//!
//! Without retirement that is every component without a receipt. With
//! `--retire-sources` a shard is deleted as soon as all its readers have
//! receipts, so the need is the peak of (artifact bytes written − shard
//! bytes freed) over the order conversion writes in (global scales first).
//! With `--retire-sources` the writer commits receipts in that order
//! (ordered completion), so a shard is freed no later than modelled; with
//! `--jobs N` up to N − 1 later components may be partly written meanwhile,
//! so the largest pending component counts N − 1 more times.

use std::collections::{BTreeMap, BTreeSet};

use crate::component::ComponentKind;
use crate::plan::Plan;

/// Bytes the artifact still needs at its peak. `shard_bytes` holds the
/// shards present on disk (a shard absent from it frees nothing).
pub fn artifact_peak(
    plan: &Plan,
    done: &BTreeSet<String>,
    shard_bytes: &BTreeMap<String, u64>,
    retire: bool,
    jobs: usize,
) -> u64 {
    let mut order: Vec<_> = plan
        .components
        .iter()
        .filter(|c| c.kind == ComponentKind::Q3GlobalScale)
        .collect();
    order.extend(
        plan.components
            .iter()
            .filter(|c| c.kind != ComponentKind::Q3GlobalScale),
    );
    order.retain(|c| !done.contains(&c.name));
    let mut remaining: BTreeMap<&str, usize> = BTreeMap::new();
    for c in &order {
        for f in &c.source_files {
            *remaining.entry(f.as_str()).or_default() += 1;
        }
    }
    let (mut level, mut peak) = (0i128, 0i128);
    for c in &order {
        level += i128::from(c.predicted_bytes);
        peak = peak.max(level);
        if retire {
            for f in &c.source_files {
                let left = remaining.entry(f.as_str()).or_default();
                *left = left.saturating_sub(1);
                if *left == 0 {
                    level -= i128::from(shard_bytes.get(f).copied().unwrap_or(0));
                }
            }
        }
    }
    let largest = order.iter().map(|c| c.predicted_bytes).max().unwrap_or(0);
    let in_flight = if retire {
        // Without retirement the peak already counts every component.
        largest.saturating_mul(jobs.saturating_sub(1) as u64)
    } else {
        0
    };
    u64::try_from(peak)
        .unwrap_or(u64::MAX)
        .saturating_add(in_flight)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Component, ComponentContent};

    fn comp(name: &str, kind: ComponentKind, bytes: u64, files: &[&str]) -> Component {
        Component {
            name: name.into(),
            kind,
            predicted_bytes: bytes,
            items: 1,
            source_files: files.iter().map(|f| f.to_string()).collect(),
            content: ComponentContent::Q3GlobalScale {
                layer: 0,
                segments: vec![],
                scales: vec![],
            },
        }
    }

    fn plan(components: Vec<Component>) -> Plan {
        Plan {
            model_type: "qwen4_exp".into(),
            profile: "qwen4_exp".into(),
            sources: vec![],
            source_bytes: 0,
            total_bytes: components.iter().map(|c| c.predicted_bytes).sum(),
            components,
            omitted: vec![],
            excluded_sources: vec![],
        }
    }

    #[test]
    fn peak_without_retirement_is_every_missing_component() {
        let p = plan(vec![
            comp("a", ComponentKind::Ftw, 10, &["s1"]),
            comp("b", ComponentKind::Ftexpert, 20, &["s2"]),
        ]);
        let shards = [("s1".to_string(), 100), ("s2".to_string(), 100)].into();
        assert_eq!(artifact_peak(&p, &BTreeSet::new(), &shards, false, 1), 30);
        assert_eq!(artifact_peak(&p, &BTreeSet::new(), &shards, false, 4), 30);
        let done = ["a".to_string()].into();
        assert_eq!(artifact_peak(&p, &done, &shards, false, 1), 20);
    }

    #[test]
    fn retirement_frees_a_shard_once_its_last_reader_is_written() {
        // Scales go first; s1 is freed after "g" and "a", s2 after "b".
        let p = plan(vec![
            comp("a", ComponentKind::Ftw, 10, &["s1"]),
            comp("b", ComponentKind::Ftexpert, 50, &["s2"]),
            comp("g", ComponentKind::Q3GlobalScale, 2, &["s1", "s2"]),
        ]);
        let shards = [("s1".to_string(), 40), ("s2".to_string(), 100)].into();
        // g: 2 → a: 12, s1 freed → −28 → b: 22, s2 freed. Peak 22.
        assert_eq!(artifact_peak(&p, &BTreeSet::new(), &shards, true, 1), 22);
        assert_eq!(artifact_peak(&p, &BTreeSet::new(), &shards, false, 1), 62);
        // Two jobs: "b" (the largest) may be in flight alongside.
        assert_eq!(artifact_peak(&p, &BTreeSet::new(), &shards, true, 2), 72);
    }

    #[test]
    fn a_retired_shard_frees_nothing() {
        let p = plan(vec![
            comp("a", ComponentKind::Ftw, 10, &["s1"]),
            comp("b", ComponentKind::Ftexpert, 50, &["s2"]),
        ]);
        // s1 is already gone: writing "a" frees nothing.
        let shards = [("s2".to_string(), 100)].into();
        assert_eq!(artifact_peak(&p, &BTreeSet::new(), &shards, true, 1), 60);
    }
}
