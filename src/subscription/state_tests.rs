//! Unit tests of the sequence state machine, one per rule of the module doc.

use bytes::Bytes;

use super::state::{Action, DropReason, Phase, SeqState};

fn p(seq: u64) -> Bytes {
    Bytes::from(format!("batch-{seq}"))
}

fn digest(seq: u64) -> u64 {
    seq * 7919 + 1
}

/// The seqs of the Apply actions, with `D` for a drop, in order.
fn trace(actions: &[Action]) -> Vec<String> {
    actions
        .iter()
        .map(|a| match a {
            Action::Apply { seq, payload } => {
                assert_eq!(payload, &p(*seq), "payload travels with its seq");
                seq.to_string()
            }
            Action::DropSource { reason } => format!("D:{}", reason.as_str()),
            Action::RequestReplay { from_seq } => format!("R:{from_seq}"),
        })
        .collect()
}

fn live(s: &mut SeqState, seqs: &[u64]) -> Vec<String> {
    seqs.iter()
        .flat_map(|&q| trace(&s.on_live(q, p(q))))
        .collect()
}

#[test]
fn in_order_batches_apply_and_duplicates_are_ignored() {
    let mut s = SeqState::new(0, false, 100);
    assert_eq!(s.phase(), Phase::Connecting);
    assert_eq!(live(&mut s, &[0, 1, 1, 2]), ["0", "1", "2"]);
    assert_eq!(s.counters().duplicates, 1);
    assert_eq!(s.phase(), Phase::Live);
    assert_eq!(s.last_applied(), Some(2));
}

#[test]
fn a_seq_regression_means_the_publisher_restarted() {
    let mut s = SeqState::new(0, false, 100);
    live(&mut s, &[0, 1, 2, 3]);
    assert_eq!(live(&mut s, &[0, 1]), ["D:publisher_restarted", "0", "1"]);
    assert_eq!(s.counters().restarts, 1);
    assert_eq!(s.counters().sources_dropped, 1);
}

#[test]
fn a_gap_without_replay_drops_the_source_and_follows_live() {
    let mut s = SeqState::new(0, false, 100);
    live(&mut s, &[0, 1]);
    assert_eq!(live(&mut s, &[5, 6]), ["D:gap_without_replay", "5", "6"]);
    assert_eq!(s.counters().gaps, 1);
}

#[test]
fn a_gap_with_replay_is_healed_in_order_without_double_apply() {
    let mut s = SeqState::new(0, true, 100);
    live(&mut s, &[0, 1]);
    assert_eq!(live(&mut s, &[4]), ["R:2"]);
    assert_eq!(s.phase(), Phase::Replaying);
    // Live batches keep arriving while the replay runs.
    assert!(live(&mut s, &[5]).is_empty());
    // The replay re-sends what we already have, then the gap, then what is also held.
    let mut t = Vec::new();
    for q in [1, 2, 3, 4, 5] {
        t.extend(trace(&s.on_replayed(q, p(q), digest(q))));
    }
    t.extend(trace(&s.on_replay_end()));
    assert_eq!(t, ["2", "3", "4", "5"]);
    assert_eq!(s.phase(), Phase::Live);
    assert_eq!(live(&mut s, &[6]), ["6"]);
    assert_eq!(s.counters().replays_ok, 1);
    assert_eq!(s.counters().sources_dropped, 0);
}

#[test]
fn a_replay_that_starts_too_late_drops_the_source() {
    let mut s = SeqState::new(0, true, 100);
    live(&mut s, &[0]);
    assert_eq!(live(&mut s, &[10]), ["R:1"]);
    let mut t = trace(&s.on_replayed(7, p(7), digest(7)));
    for q in [8, 9, 10] {
        t.extend(trace(&s.on_replayed(q, p(q), digest(q))));
    }
    t.extend(trace(&s.on_replay_end()));
    assert_eq!(t, ["D:replay_incomplete", "7", "8", "9", "10"]);
    assert_eq!(s.counters().replays_failed, 1);
}

#[test]
fn a_replay_that_stops_short_of_the_held_batches_drops_the_source() {
    let mut s = SeqState::new(0, true, 100);
    live(&mut s, &[0]);
    live(&mut s, &[5]);
    let mut t = trace(&s.on_replayed(1, p(1), digest(1)));
    t.extend(trace(&s.on_replay_end()));
    assert_eq!(t, ["1", "D:replay_incomplete", "5"]);
    assert_eq!(s.counters().replays_failed, 1);
}

#[test]
fn a_failed_replay_drops_the_source_and_applies_the_held_stream() {
    let mut s = SeqState::new(0, true, 100);
    live(&mut s, &[0]);
    live(&mut s, &[3, 4]);
    assert_eq!(trace(&s.on_replay_failed()), ["D:replay_failed", "3", "4"]);
    assert_eq!(s.phase(), Phase::Live);
    // A late replay answer after giving up changes nothing.
    assert!(s.on_replayed(1, p(1), digest(1)).is_empty());
    assert!(s.on_replay_end().is_empty());
}

#[test]
fn too_many_held_batches_abandon_the_replay() {
    let mut s = SeqState::new(0, true, 2);
    live(&mut s, &[0]);
    live(&mut s, &[3, 4]);
    assert_eq!(live(&mut s, &[5]), ["D:replay_overflow", "3", "4", "5"]);
    assert!(!s.is_replaying());
}

#[test]
fn too_many_held_bytes_abandon_the_replay() {
    // Each payload is 7 or 8 bytes ("batch-N"): two fit in 16 bytes, a third does not.
    let mut s = SeqState::new(0, true, 100).with_max_held_bytes(16);
    live(&mut s, &[0]);
    assert_eq!(live(&mut s, &[3, 4]), ["R:1"]);
    assert!(s.is_replaying());
    assert_eq!(live(&mut s, &[5]), ["D:replay_overflow", "3", "4", "5"]);
    assert!(!s.is_replaying());
    assert_eq!(s.counters().replays_failed, 1);
}

#[test]
fn a_late_join_with_replay_asks_for_the_stream_start() {
    let mut s = SeqState::new(0, true, 100);
    assert_eq!(live(&mut s, &[3]), ["R:0"]);
    let mut t = Vec::new();
    for q in 0..3 {
        t.extend(trace(&s.on_replayed(q, p(q), digest(q))));
    }
    t.extend(trace(&s.on_replay_end()));
    assert_eq!(t, ["0", "1", "2", "3"]);
    assert_eq!(s.counters().replays_ok, 1);
}

#[test]
fn a_late_join_without_replay_just_starts() {
    let mut s = SeqState::new(1, false, 100);
    assert_eq!(live(&mut s, &[7, 8]), ["7", "8"]);
    assert_eq!(s.counters().sources_dropped, 0);
}

#[test]
fn the_mooncake_stream_starts_at_one() {
    let mut s = SeqState::new(1, true, 100);
    assert_eq!(live(&mut s, &[1, 2]), ["1", "2"]);
}

#[test]
fn a_restart_into_a_late_seq_replays_the_new_stream() {
    let mut s = SeqState::new(0, true, 100);
    live(&mut s, &[0, 1, 2, 3, 4]);
    assert_eq!(live(&mut s, &[2]), ["D:publisher_restarted", "R:0"]);
    let mut t = Vec::new();
    for q in 0..2 {
        t.extend(trace(&s.on_replayed(q, p(q), digest(q))));
    }
    t.extend(trace(&s.on_replay_end()));
    assert_eq!(t, ["0", "1", "2"]);
}

#[test]
fn catch_up_after_recovery_requests_the_missed_batches() {
    let mut s = SeqState::new(0, true, 100);
    s.resume_from(41);
    assert_eq!(trace(&s.begin_catch_up()), ["R:42"]);
    assert!(live(&mut s, &[45]).is_empty());
    let mut t = Vec::new();
    for q in 42..45 {
        t.extend(trace(&s.on_replayed(q, p(q), digest(q))));
    }
    t.extend(trace(&s.on_replay_end()));
    assert_eq!(t, ["42", "43", "44", "45"]);
    // Without a replay socket, recovery simply waits for live batches.
    let mut s = SeqState::new(0, false, 100);
    s.resume_from(41);
    assert!(s.begin_catch_up().is_empty());
    assert_eq!(live(&mut s, &[42]), ["42"]);
}

#[test]
fn after_the_replay_a_further_gap_among_held_batches_drops_instead_of_looping() {
    let mut s = SeqState::new(0, true, 100);
    live(&mut s, &[0]);
    live(&mut s, &[2, 5]);
    let mut t = trace(&s.on_replayed(1, p(1), digest(1)));
    t.extend(trace(&s.on_replay_end()));
    assert_eq!(
        t,
        [
            "1",
            "2",
            &format!("D:{}", DropReason::GapWithoutReplay.as_str()),
            "5"
        ]
    );
}

#[test]
fn a_verified_resume_skips_what_the_checkpoint_has() {
    let mut s = SeqState::new(0, true, 100);
    s.resume_verified(41, digest(41));
    assert_eq!(trace(&s.begin_catch_up()), ["R:41"]);
    let mut t = Vec::new();
    for q in 41..44 {
        t.extend(trace(&s.on_replayed(q, p(q), digest(q))));
    }
    t.extend(trace(&s.on_replay_end()));
    assert_eq!(t, ["42", "43"]);
    assert_eq!(s.counters().sources_dropped, 0);
}

#[test]
fn a_publisher_that_restarted_while_we_were_down_is_dropped() {
    let mut s = SeqState::new(0, true, 100);
    s.resume_verified(41, digest(41));
    s.begin_catch_up();
    assert!(live(&mut s, &[44]).is_empty(), "held while replaying");
    // The new process also reached seq 41, with other bytes: its stream is replayed from its
    // start, not from our old position (its batches 0..41 are in its buffer too).
    assert_eq!(
        trace(&s.on_replayed(41, p(41), 12345)),
        ["D:publisher_restarted", "R:0"]
    );
    let mut t = Vec::new();
    for q in 0..44 {
        t.extend(trace(&s.on_replayed(q, p(q), digest(q))));
    }
    t.extend(trace(&s.on_replay_end()));
    let expected: Vec<String> = (0..45).map(|q: u64| q.to_string()).collect();
    assert_eq!(t, expected);
    assert_eq!(s.counters().sources_dropped, 1);
    assert_eq!(s.counters().restarts, 1);
    assert_eq!(s.phase(), Phase::Live);
    // When its buffer no longer reaches its own start, the replay takes what it holds, with no
    // second drop (the source holds nothing of the new stream).
    let mut s = SeqState::new(0, true, 100);
    s.resume_verified(41, digest(41));
    s.begin_catch_up();
    s.on_replayed(41, p(41), 12345);
    let mut t = Vec::new();
    for q in 30..43 {
        t.extend(trace(&s.on_replayed(q, p(q), digest(q))));
    }
    t.extend(trace(&s.on_replay_end()));
    let expected: Vec<String> = (30..43).map(|q: u64| q.to_string()).collect();
    assert_eq!(t, expected);
    assert_eq!(s.counters().sources_dropped, 1);
    // Or the buffer no longer reaches our position.
    let mut s = SeqState::new(0, true, 100);
    s.resume_verified(41, digest(41));
    s.begin_catch_up();
    assert_eq!(
        trace(&s.on_replayed(60, p(60), digest(60))),
        ["D:replay_incomplete", "60"]
    );
}

#[test]
fn a_resume_whose_batch_the_publisher_no_longer_has_is_dropped() {
    let mut s = SeqState::new(0, true, 100);
    s.resume_verified(41, digest(41));
    s.begin_catch_up();
    // A restarted publisher at seq 5 answers a request for 41 with the end marker only.
    assert_eq!(trace(&s.on_replay_end()), ["D:replay_incomplete"]);
    // The new stream is then followed from its start, through the replay socket.
    assert_eq!(live(&mut s, &[6]), ["R:0"]);
}

/// Migration 5 sets the position of a source to rebuild past every batch: the source is dropped
/// and rebuilt from its publisher, whatever the publisher sends.
#[test]
fn a_resume_past_every_batch_drops_the_source_and_rebuilds_it_from_the_stream_start() {
    let past = u64::MAX;
    // With a replay socket: the replay from there brings nothing, then the whole buffer.
    let mut s = SeqState::new(0, true, 100);
    s.resume_verified(past, 0);
    assert_eq!(trace(&s.begin_catch_up()), [format!("R:{past}")]);
    assert!(live(&mut s, &[7]).is_empty(), "held while replaying");
    assert_eq!(trace(&s.on_replay_end()), ["D:replay_incomplete", "R:0"]);
    let mut t = Vec::new();
    for q in 0..8 {
        t.extend(trace(&s.on_replayed(q, p(q), digest(q))));
    }
    t.extend(trace(&s.on_replay_end()));
    assert_eq!(t, ["0", "1", "2", "3", "4", "5", "6", "7"]);
    // Without one, any batch reads as a restarted publisher, a new stream's first one too.
    for first in [0, 5] {
        let mut s = SeqState::new(0, false, 100);
        s.resume_verified(past, 0);
        assert!(s.begin_catch_up().is_empty());
        assert_eq!(
            live(&mut s, &[first]),
            ["D:publisher_restarted".to_owned(), first.to_string()]
        );
    }
}

#[test]
fn a_start_from_the_stream_start_replays_the_whole_buffer_then_goes_live() {
    let mut s = SeqState::new(0, true, 100);
    assert_eq!(trace(&s.begin_from_start()), ["R:0"]);
    // Only once, and not while the replay runs.
    assert!(s.begin_from_start().is_empty());
    assert!(live(&mut s, &[3]).is_empty(), "held while replaying");
    let replayed: Vec<String> = [0, 1, 2]
        .iter()
        .flat_map(|&q| trace(&s.on_replayed(q, p(q), digest(q))))
        .collect();
    assert_eq!(replayed, ["0", "1", "2"]);
    assert_eq!(trace(&s.on_replay_end()), ["3"]);
    assert_eq!(s.phase(), Phase::Live);
    // Without a replay socket there is nothing to ask.
    let mut plain = SeqState::new(0, false, 100);
    assert!(plain.begin_from_start().is_empty());
}

/// Sequence arithmetic at the end of the range neither wraps nor panics: a publisher (or a
/// hostile peer) sending seq `u64::MAX` is applied once, and nothing is taken to follow it.
#[test]
fn seq_u64_max_never_wraps_or_panics() {
    let max = u64::MAX;
    // A verified resume at the last seq, and a replay that repeats it.
    let mut s = SeqState::new(0, true, 100);
    s.resume_verified(max, digest(7));
    assert_eq!(trace(&s.begin_catch_up()), [format!("R:{max}")]);
    assert!(trace(&s.on_replayed(max, p(max), digest(7))).is_empty());
    assert!(trace(&s.on_replayed(max, p(max), digest(7))).is_empty());
    assert!(trace(&s.on_replay_end()).is_empty());
    assert_eq!(s.last_applied(), Some(max));
    assert_eq!(s.counters().sources_dropped, 0);
    // A gap up to the last seq, replayed: applied once.
    let mut s = SeqState::new(0, true, 100);
    assert_eq!(live(&mut s, &[0]), ["0"]);
    assert_eq!(live(&mut s, &[max]), ["R:1"]);
    assert_eq!(
        trace(&s.on_replayed(max, p(max), digest(1))),
        ["D:replay_incomplete", max.to_string().as_str()]
    );
    assert!(trace(&s.on_replayed(max, p(max), digest(1))).is_empty());
    assert!(
        trace(&s.on_replay_end()).is_empty(),
        "the held batch was applied by the replay"
    );
    assert_eq!(s.next_needed(), Some(max));
    // Live: the last seq twice is a duplicate, then a regression is a restart.
    let mut s = SeqState::new(0, false, 100);
    assert_eq!(live(&mut s, &[max, max]), [max.to_string()]);
    assert_eq!(live(&mut s, &[0]), ["D:publisher_restarted", "0"]);
    // Held batches after a replay, the last seq among them.
    let mut s = SeqState::new(0, true, 100);
    assert_eq!(live(&mut s, &[0, 2]), ["0", "R:1"]);
    assert!(live(&mut s, &[max, 3]).is_empty());
    assert_eq!(trace(&s.on_replayed(1, p(1), digest(1))), ["1"]);
    assert_eq!(
        trace(&s.on_replay_end()),
        [
            "2",
            "D:gap_without_replay",
            &max.to_string(),
            "D:publisher_restarted",
            // The new stream's first batch past its start: its buffer is asked for the rest.
            "R:0"
        ]
    );
}

#[test]
fn an_unreachable_publisher_is_dropped_once_and_taken_up_afresh() {
    let mut s = SeqState::new(0, true, 100);
    live(&mut s, &[0, 1, 2]);
    assert_eq!(trace(&s.on_unreachable()), ["D:publisher_unreachable"]);
    assert_eq!((s.last_applied(), s.phase()), (None, Phase::Resyncing));
    assert!(s.on_unreachable().is_empty(), "nothing left to drop");
    assert_eq!(s.counters().sources_dropped, 1);
    // Back: the whole buffer is asked for, and the rebuilt stream goes live.
    assert_eq!(trace(&s.begin_from_start()), ["R:0"]);
    assert!(live(&mut s, &[4]).is_empty(), "held while replaying");
    let replayed: Vec<String> = [0, 1, 2, 3]
        .into_iter()
        .flat_map(|q| trace(&s.on_replayed(q, p(q), digest(q))))
        .collect();
    assert_eq!(replayed, ["0", "1", "2", "3"]);
    assert_eq!(trace(&s.on_replay_end()), ["4"]);
    assert_eq!(s.phase(), Phase::Live);
    // A replay in progress is abandoned with the source; its late answers are ignored.
    let mut s = SeqState::new(0, true, 100);
    live(&mut s, &[0]);
    assert_eq!(live(&mut s, &[5]), ["R:1"]);
    assert_eq!(trace(&s.on_unreachable()), ["D:publisher_unreachable"]);
    assert!(s.on_replayed(1, p(1), digest(1)).is_empty());
    assert!(!s.is_replaying());
}

/// A source rebuilt by a replay that delivers every batch, the held ones included, is live
/// again once the replay ends (a restarted publisher whose first new batch was lost).
#[test]
fn a_replay_that_rebuilds_the_source_ends_live() {
    let mut s = SeqState::new(0, true, 100);
    assert_eq!(live(&mut s, &[0, 1, 2, 3]), ["0", "1", "2", "3"]);
    // The publisher restarted; its batch 0 was lost on the way, batch 1 is a regression.
    assert_eq!(live(&mut s, &[1]), ["D:publisher_restarted", "R:0"]);
    assert!(live(&mut s, &[2]).is_empty(), "held while replaying");
    let replayed: Vec<String> = (0..3)
        .flat_map(|q| trace(&s.on_replayed(q, p(q), digest(q))))
        .collect();
    assert_eq!(replayed, ["0", "1", "2"]);
    assert!(
        trace(&s.on_replay_end()).is_empty(),
        "every held batch was replayed"
    );
    assert_eq!(s.phase(), Phase::Live);
}
