//! The ingest step without a runtime: what the subscription actor's batch handler did, as data.

use std::sync::Arc;

use rmpv::Value as M;

use super::*;
use crate::subscription::ingest::tests::{batch, config, stored};

fn mark(seq: u64) -> Watermark {
    Watermark { seq, digest: seq }
}

fn ingest(limits: RouteLimits) -> Ingest {
    Ingest::new(Arc::new(config()), limits, None, [])
}

fn applied(step: &IngestStep) -> &AppliedBatch {
    match &step.status {
        StatusChange::Applied(a) => a,
        other => panic!("not applied: {other:?}"),
    }
}

#[test]
fn a_batch_gives_one_index_batch_per_context_in_order_and_its_counts() {
    let mut ingest = ingest(RouteLimits::default());
    let payload = batch(
        vec![
            stored(7, 2, None),
            stored(8, 4, None),
            stored(9, 2, Some("adapter")),
            M::from("not an event"),
        ],
        1,
    );
    let step = ingest.step(mark(3), &payload);
    assert_eq!(step.mark, mark(3));
    let contexts: Vec<&str> = step
        .batches
        .iter()
        .map(|b| b.context.lora_name.as_str())
        .collect();
    assert_eq!(contexts, ["", "adapter"]);
    for b in &step.batches {
        assert_eq!(b.batch.source, config().subscription_key());
        assert!(!b.batch.ops.is_empty());
    }
    let a = applied(&step);
    assert_eq!(
        a.counts,
        EventCounts {
            stored: 3,
            invalid: 1,
            ..Default::default()
        }
    );
    assert_eq!(a.ignored, [IgnoreReason::BlockSizeMismatch]);
    assert_eq!(a.last_batch_ts_ms, Some(1_500_000_000_000));
    assert!(step.warnings.is_empty());

    let mut status = SubscriptionStatus::default();
    let mut change = step.status.clone();
    change.profile_conflict();
    change.clone().apply(&mut status);
    change.apply(&mut status);
    assert_eq!(status.events["stored"], 6);
    assert_eq!(status.events["removed"], 0);
    assert_eq!(status.invalid_events, 2);
    assert_eq!(status.profile_conflicts, 2);
    assert_eq!(status.ignored["block_size_mismatch"], 2);
    assert_eq!(status.last_batch_ts_ms, Some(1_500_000_000_000));
}

#[test]
fn an_undecodable_payload_or_another_rank_is_counted_and_warned_and_routes_nothing() {
    let mut ingest = ingest(RouteLimits::default());
    let step = ingest.step(mark(1), b"\xc1");
    assert!(step.batches.is_empty());
    assert_eq!(step.status, StatusChange::Undecodable);
    assert!(matches!(step.warnings[..], [IngestWarning::Undecodable(_)]));
    assert_eq!(step.warnings[0].kind(), "undecodable");

    let step = ingest.step(mark(2), &batch(vec![stored(7, 2, None)], 3));
    assert!(step.batches.is_empty());
    assert_eq!(step.status, StatusChange::OtherRank);
    assert_eq!(step.warnings, [IngestWarning::OtherRank(Some(3))]);
    assert_eq!(step.warnings[0].kind(), "rank_mismatch");

    let mut status = SubscriptionStatus::default();
    for change in [StatusChange::Undecodable, StatusChange::OtherRank] {
        let mut change = change;
        change.profile_conflict(); // nothing was routed: nothing to count
        change.apply(&mut status);
    }
    assert_eq!((status.decode_errors, status.rank_mismatches), (1, 1));
    assert_eq!(status.profile_conflicts, 0);
    assert!(status.events.is_empty(), "a rejected batch applies nothing");

    // Rejected batches still move the source's position.
    let fed = config().context_key();
    let mut ingest = Ingest::new(Arc::new(config()), RouteLimits::default(), None, [fed]);
    ingest.step(mark(5), b"\xc1");
    assert_eq!(ingest.due_marks(), [(config().context_key(), mark(5))]);
}

#[test]
fn refused_events_are_counted_by_field_with_the_first_as_example() {
    let mut ingest = ingest(RouteLimits {
        max_contexts: 1,
        max_name_bytes: 4,
        ..RouteLimits::default()
    });
    let payload = batch(
        vec![
            stored(7, 2, None),
            stored(8, 2, Some("too long")),
            stored(9, 2, Some("longer still")),
            stored(10, 2, Some("ad")),
        ],
        1,
    );
    let step = ingest.step(mark(1), &payload);
    assert_eq!(step.batches.len(), 1, "only the first context is admitted");
    let kinds: Vec<(&str, u64)> = step
        .warnings
        .iter()
        .map(|w| match w {
            IngestWarning::Refused { field, count, .. } => (*field, *count),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(kinds, [("lora_name", 2), ("max_contexts_per_source", 1)]);
    let IngestWarning::Refused { example, .. } = &step.warnings[0] else {
        unreachable!()
    };
    assert!(example.contains("too long"), "{example}");
    assert_eq!(step.warnings[1].kind(), "max_contexts_per_source");
    assert_eq!(
        applied(&step).refused,
        [("lora_name", 2), ("max_contexts_per_source", 1)]
    );
    let mut status = SubscriptionStatus::default();
    step.status.apply(&mut status);
    assert_eq!(status.refused["lora_name"], 2);
    assert_eq!(status.refused["max_contexts_per_source"], 1);
}

#[test]
fn marks_follow_what_was_delivered_and_a_drop_forgets_them() {
    let recovered = ContextKey::new("default", "m", "old-adapter", 2);
    let mut ingest = Ingest::new(
        Arc::new(config()),
        RouteLimits::default(),
        Some(mark(9)),
        [recovered.clone()],
    );
    // Resumed at 9: the registered context and the recovered one are due that mark until they
    // are sent it.
    let registered = config().context_key();
    assert_eq!(
        ingest.due_marks(),
        [(registered, mark(9)), (recovered.clone(), mark(9))]
    );
    assert!(ingest.due_marks().is_empty());

    let step = ingest.step(mark(10), &batch(vec![stored(7, 2, None)], 1));
    let context = step.batches[0].context.clone();
    ingest.delivered(&context, 10);
    // The context that got ops has the mark; the recovered one lags and is due it.
    assert_eq!(ingest.due_marks(), [(recovered.clone(), mark(10))]);

    ingest.source_dropped();
    assert!(
        ingest.due_marks().is_empty(),
        "a dropped stream has no position"
    );
}

#[test]
fn the_hash_check_sees_the_stored_blocks() {
    let mut ingest = ingest(RouteLimits::default());
    let step = ingest.step(mark(1), &batch(vec![stored(7, 2, None)], 1));
    let check = applied(&step).hash_check;
    let (state, ok, mismatch, rate) = ingest.hash_check.summary();
    assert_eq!(
        check,
        HashCheckSummary {
            state,
            ok,
            mismatch,
            mismatch_rate: rate
        }
    );
    assert_eq!(check.ok + check.mismatch, 1, "{check:?}");
    let mut status = SubscriptionStatus::default();
    step.status.apply(&mut status);
    assert_eq!(status.hash_check, check.state);
    assert_eq!(status.hash_check_ok + status.hash_check_mismatch, 1);
}

#[test]
fn timestamps_become_milliseconds_or_nothing() {
    assert_eq!(timestamp_ms(1.5, true), Some(1500));
    assert_eq!(timestamp_ms(1500.0, false), Some(1500));
    assert_eq!(timestamp_ms(-1.0, true), None);
    assert_eq!(timestamp_ms(f64::NAN, false), None);
    assert_eq!(timestamp_ms(f64::INFINITY, true), None);
}
