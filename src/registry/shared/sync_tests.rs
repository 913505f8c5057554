//! The etcd sync rules: listings diff against what runs, watch events apply once and in order,
//! anything under the prefix that is not a registration is ignored, compaction forces a list.
//! A listing that does not continue the followed history (another cluster, a lost epoch, a
//! revision gone back, everything gone without a history to tell) holds what it lacks.

use super::*;
use crate::durability::codec::registration_value;
use crate::registry::shared::reset::{History, Listed, ResetReason};

const PREFIX: &str = "/mc/";
const CLUSTER: u64 = 0xc1;
const EPOCH: &str = "epoch-1";

/// A listing at `revision` of the cluster and epoch every test follows.
fn at(revision: i64) -> Listed {
    Listed {
        revision,
        cluster_id: CLUSTER,
        epoch: Some(EPOCH.into()),
    }
}

fn history(revision: i64) -> Option<History> {
    Some(History {
        epoch: Some(EPOCH.into()),
        cluster_id: CLUSTER,
        revision,
    })
}

fn held(s: &SyncState) -> Vec<PublisherConfig> {
    s.held()
}

fn config(i: u32, port: u16) -> PublisherConfig {
    PublisherConfig::test_vllm(&format!("e{i}"), &format!("tcp://127.0.0.1:{port}"))
}

fn kv(c: &PublisherConfig, rev: i64) -> Kv {
    Kv {
        key: registration_key(PREFIX, &c.subscription_key()).into_bytes(),
        value: registration_value(c),
        mod_revision: rev,
    }
}

fn delete(c: &PublisherConfig, rev: i64) -> Event {
    Event::Delete {
        key: registration_key(PREFIX, &c.subscription_key()).into_bytes(),
        mod_revision: rev,
    }
}

#[test]
fn a_fresh_state_lists_then_watches_after_the_listed_revision() {
    let mut s = SyncState::new(PREFIX, []);
    assert_eq!(s.next_step(), Step::List);
    let (a, b) = (config(1, 7001), config(2, 7002));
    let changes = s.apply_list([kv(&a, 3), kv(&b, 5)], at(9));
    assert_eq!(changes, vec![Change::Start(a), Change::Start(b)]);
    assert_eq!(s.next_step(), Step::Watch { from: 10 });
    assert_eq!(s.registrations(), 2);
}

#[test]
fn the_first_list_stops_local_registrations_etcd_does_not_hold_and_keeps_the_others() {
    let (kept, gone, changed) = (config(1, 7001), config(2, 7002), config(3, 7003));
    let mut s = SyncState::new(PREFIX, [kept.clone(), gone.clone(), changed.clone()]);
    let mut changed_now = changed.clone();
    changed_now.endpoint = "tcp://127.0.0.1:7999".into();
    let changes = s.apply_list([kv(&kept, 2), kv(&changed_now, 4)], at(4));
    assert_eq!(
        changes,
        vec![
            Change::Stop(gone.subscription_key()),
            Change::Stop(changed.subscription_key()),
            Change::Start(changed_now),
        ]
    );
}

#[test]
fn the_seed_goes_up_only_when_the_first_listing_is_empty() {
    let (a, b) = (config(1, 7001), config(2, 7002));
    let mut s =
        SyncState::new(PREFIX, [a.clone(), b.clone()]).with_seed(vec![a.clone(), b.clone()]);
    assert_eq!(s.take_seed(true), vec![a.clone(), b.clone()]);
    // Taken once; an upload etcd refused is handed back for the next listing.
    assert!(s.take_seed(true).is_empty());
    s.restore_seed(vec![a.clone()]);
    assert_eq!(s.take_seed(true), vec![a.clone()]);
    // A listing that holds anything wins: the seed is dropped, not kept for later.
    let mut s = SyncState::new(PREFIX, [a.clone()]).with_seed(vec![a.clone()]);
    assert!(s.take_seed(false).is_empty());
    assert!(s.take_seed(true).is_empty());
    assert_eq!(
        s.apply_list([kv(&b, 3)], at(3)),
        vec![Change::Stop(a.subscription_key()), Change::Start(b)]
    );
}

#[test]
fn watch_events_start_change_and_stop() {
    let mut s = SyncState::new(PREFIX, []);
    s.apply_list([], at(1));
    let a = config(1, 7001);
    let mut a2 = a.clone();
    a2.model_name = "other".into();
    assert_eq!(
        s.apply_events([Event::Put(kv(&a, 2))]),
        vec![Change::Start(a.clone())]
    );
    // The same value written again (a no-op put) changes nothing.
    assert_eq!(s.apply_events([Event::Put(kv(&a, 3))]), vec![]);
    assert_eq!(
        s.apply_events([Event::Put(kv(&a2, 4))]),
        vec![Change::Stop(a.subscription_key()), Change::Start(a2)]
    );
    assert_eq!(
        s.apply_events([delete(&a, 5)]),
        vec![Change::Stop(a.subscription_key())]
    );
    assert_eq!(s.registrations(), 0);
    assert_eq!(s.next_step(), Step::Watch { from: 6 });
}

#[test]
fn events_already_applied_are_ignored_after_a_resumed_watch() {
    let mut s = SyncState::new(PREFIX, []);
    let a = config(1, 7001);
    s.apply_list([kv(&a, 5)], at(7));
    // A delete at or below the listed revision is history the listing already contains.
    assert_eq!(s.apply_events([delete(&a, 6)]), vec![]);
    assert_eq!(s.registrations(), 1);
    assert_eq!(
        s.apply_events([delete(&a, 8)]),
        vec![Change::Stop(a.subscription_key())]
    );
}

#[test]
fn a_progress_notification_advances_the_revision() {
    let mut s = SyncState::new(PREFIX, []);
    s.apply_list([], at(3));
    s.progress(40);
    assert_eq!(s.next_step(), Step::Watch { from: 41 });
    // Never backwards.
    s.progress(12);
    assert_eq!(s.revision(), 40);
}

#[test]
fn garbage_under_the_prefix_is_counted_and_never_applied() {
    let mut s = SyncState::new(PREFIX, []);
    let a = config(1, 7001);
    let mut wrong_key = kv(&a, 2);
    wrong_key.key = registration_key(PREFIX, &SubscriptionKey::new("x", "", 0)).into_bytes();
    let not_json = Kv {
        key: b"/mc/registrations/y|default|0".to_vec(),
        value: b"\xff\x00not json".to_vec(),
        mod_revision: 3,
    };
    let not_utf8_key = Kv {
        key: b"/mc/registrations/\xff".to_vec(),
        value: registration_value(&a),
        mod_revision: 4,
    };
    // A key outside the registrations sub-prefix is someone else's, not an error.
    let elsewhere = Kv {
        key: b"/mc/other/thing".to_vec(),
        value: b"{}".to_vec(),
        mod_revision: 5,
    };
    let changes = s.apply_list(
        [wrong_key, not_json.clone(), not_utf8_key, elsewhere],
        at(5),
    );
    assert_eq!(changes, vec![]);
    assert_eq!(s.invalid(), 2);
    let mut later = not_json;
    later.mod_revision = 6;
    assert_eq!(s.apply_events([Event::Put(later)]), vec![]);
    assert_eq!(s.invalid(), 3);
    // A running registration overwritten with garbage is stopped: etcd no longer holds it.
    s.apply_events([Event::Put(kv(&a, 7))]);
    let mut garbage = kv(&a, 8);
    garbage.value = b"[]".to_vec();
    assert_eq!(
        s.apply_events([Event::Put(garbage)]),
        vec![Change::Stop(a.subscription_key())]
    );
}

#[test]
fn compaction_forces_a_full_list_that_catches_up_on_what_was_missed() {
    let mut s = SyncState::new(PREFIX, []);
    let (a, b) = (config(1, 7001), config(2, 7002));
    s.apply_list([kv(&a, 2)], at(2));
    s.resync();
    assert_eq!(s.next_step(), Step::List);
    // Meanwhile a was deleted and b registered; the history of both is gone.
    let changes = s.apply_list([kv(&b, 30)], at(31));
    assert_eq!(
        changes,
        vec![Change::Stop(a.subscription_key()), Change::Start(b)]
    );
    assert_eq!(s.next_step(), Step::Watch { from: 32 });
}

#[test]
fn an_etcd_whose_store_went_back_is_listed_again_and_what_it_lacks_is_held() {
    let mut s = SyncState::new(PREFIX, []);
    let (a, b) = (config(1, 7001), config(2, 7002));
    s.apply_list([kv(&a, 40)], at(50));
    assert!(s.watch_created(50, CLUSTER));
    assert!(s.watch_created(60, CLUSTER));
    // A restore at revision 3: watching from 51 would wait for unrelated history.
    assert!(!s.watch_created(3, CLUSTER));
    assert_eq!(s.next_step(), Step::List);
    // What it holds starts; what it lacks keeps running, held, instead of being stopped.
    let changes = s.apply_list([kv(&b, 2)], at(3));
    assert_eq!(changes, vec![Change::Start(b)]);
    assert_eq!(held(&s), vec![a]);
    let reason = s.suspicion().map(|x| x.reason);
    assert_eq!(reason, Some(ResetReason::RevisionBackwards));
    // The watch goes on from the listing: etcd's history from now on is this one.
    assert_eq!(s.next_step(), Step::Watch { from: 4 });
}

#[test]
fn a_restarted_replica_judges_the_first_listing_against_its_stored_history() {
    let (a, b) = (config(1, 7001), config(2, 7002));
    let local = [a.clone(), b.clone()];
    // Revision 50 applied before the restart; etcd now says 3 and lists nothing.
    let mut s = SyncState::new(PREFIX, local.clone()).with_history(history(50));
    assert_eq!(s.apply_list([], at(3)), vec![]);
    assert_eq!(held(&s), vec![a.clone(), b.clone()]);
    let detected = s.take_detected().map(|x| x.reason);
    assert_eq!(detected, Some(ResetReason::RevisionBackwards));
    assert_eq!(s.take_detected(), None, "counted once");
    // The same listing after the fleet's own removals (revision forward) is applied.
    let mut s = SyncState::new(PREFIX, local).with_history(history(50));
    let changes = s.apply_list([], at(52));
    let stops = vec![
        Change::Stop(a.subscription_key()),
        Change::Stop(b.subscription_key()),
    ];
    assert_eq!(changes, stops);
    assert!(held(&s).is_empty() && s.take_detected().is_none());
}

#[test]
fn a_registration_listed_as_older_than_applied_means_a_restore() {
    // A restore that bumped the store revision past the one applied: the revision alone looks
    // fine, but a registration etcd lists is older than the version this replica applied.
    let mut s = SyncState::new(PREFIX, []);
    let (a, b) = (config(1, 7001), config(2, 7002));
    s.apply_list([kv(&a, 10), kv(&b, 40)], at(50));
    s.resync();
    let changes = s.apply_list([kv(&a, 10), kv(&b, 30)], at(1_000));
    assert_eq!(changes, vec![]);
    let reason = s.take_detected().map(|x| x.reason);
    assert_eq!(reason, Some(ResetReason::RevisionBackwards));
    // Nothing was lacking, so nothing is held and nothing is degraded.
    assert!(held(&s).is_empty());
    assert_eq!(s.suspicion(), None);
}

#[test]
fn another_cluster_id_is_a_suspected_reset() {
    let mut s = SyncState::new(PREFIX, []);
    let (a, b) = (config(1, 7001), config(2, 7002));
    s.apply_list([kv(&a, 4), kv(&b, 5)], at(5));
    // The watch of another cluster is not resumed, even at a higher revision.
    assert!(!s.watch_created(90, 0xbad));
    assert_eq!(s.next_step(), Step::List);
    let other = Listed {
        cluster_id: 0xbad,
        ..at(90)
    };
    assert_eq!(s.apply_list([kv(&a, 7)], other), vec![]);
    assert_eq!(held(&s), vec![b.clone()]);
    let reason = s.suspicion().map(|x| x.reason);
    assert_eq!(reason, Some(ResetReason::ClusterChanged));
    // From now on that cluster is the one followed.
    assert!(s.watch_created(91, 0xbad));
    // A header without a cluster id (0) says nothing either way.
    assert!(s.watch_created(92, 0));
}

#[test]
fn an_etcd_without_the_epoch_followed_holds_everything_until_it_is_written_back() {
    let (a, b) = (config(1, 7001), config(2, 7002));
    let mut s = SyncState::new(PREFIX, [a.clone(), b.clone()]).with_history(history(20));
    // Wiped and written to by other clients since: a higher revision, no epoch.
    let wiped = Listed {
        epoch: None,
        ..at(400)
    };
    assert_eq!(s.apply_list([], wiped), vec![]);
    assert_eq!(held(&s), vec![a.clone(), b.clone()]);
    let reason = s.suspicion().map(|x| x.reason);
    assert_eq!(reason, Some(ResetReason::HistoryLost));
    s.adopt_epoch("epoch-2".into());
    // Nothing is recorded while something is held: a restart must judge the same way.
    assert_eq!(s.take_persist(), None);
    // Written back (by this replica or another): the watch delivers them, the hold ends.
    assert_eq!(s.apply_events([Event::Put(kv(&a, 401))]), vec![]);
    assert_eq!(held(&s), vec![b.clone()]);
    assert!(s.suspicion().is_some());
    assert_eq!(s.apply_events([Event::Put(kv(&b, 402))]), vec![]);
    assert!(held(&s).is_empty());
    assert_eq!(s.suspicion(), None);
    let recorded = s.take_persist().expect("recorded once nothing is held");
    assert_eq!(recorded.epoch.as_deref(), Some("epoch-2"));
    assert_eq!(recorded.revision, 402);
    assert_eq!(s.take_persist(), None, "recorded once");
}

#[test]
fn a_held_registration_etcd_gets_in_another_configuration_is_replaced() {
    let a = config(1, 7001);
    let mut s = SyncState::new(PREFIX, [a.clone()]).with_history(history(20));
    s.apply_list(
        [],
        Listed {
            epoch: None,
            ..at(2)
        },
    );
    let mut other = a.clone();
    other.model_name = "other".into();
    assert_eq!(
        s.apply_events([Event::Put(kv(&other, 3))]),
        vec![Change::Stop(a.subscription_key()), Change::Start(other)]
    );
    assert!(held(&s).is_empty());
}

#[test]
fn an_empty_listing_without_a_history_to_tell_is_held() {
    // A store from a build that kept no history: etcd lists nothing while this replica runs
    // registrations, and nothing says the fleet removed them.
    let (a, b) = (config(1, 7001), config(2, 7002));
    let mut s = SyncState::new(PREFIX, [a.clone(), b.clone()]);
    assert_eq!(s.apply_list([], at(9)), vec![]);
    assert_eq!(held(&s), vec![a.clone(), b.clone()]);
    let reason = s.suspicion().map(|x| x.reason);
    assert_eq!(reason, Some(ResetReason::AllRemoved));
    // A listing that still holds one of them is a plain diff.
    let mut s = SyncState::new(PREFIX, [a.clone(), b.clone()]);
    let changes = s.apply_list([kv(&a, 3)], at(9));
    assert_eq!(changes, vec![Change::Stop(b.subscription_key())]);
    assert!(held(&s).is_empty());
}

#[test]
fn the_fleet_removing_every_registration_through_the_watch_is_applied() {
    let (a, b) = (config(1, 7001), config(2, 7002));
    let mut s = SyncState::new(PREFIX, []);
    s.apply_list([kv(&a, 2), kv(&b, 3)], at(3));
    assert_eq!(
        s.apply_events([delete(&a, 4), delete(&b, 5)]),
        vec![
            Change::Stop(a.subscription_key()),
            Change::Stop(b.subscription_key())
        ]
    );
    assert!(held(&s).is_empty() && s.take_detected().is_none());
    // And a listing after a reconnect, in the same history, agrees.
    s.resync();
    assert_eq!(s.apply_list([], at(5)), vec![]);
    assert!(s.take_detected().is_none());
}

#[test]
fn an_operator_confirming_the_listing_stops_what_is_held() {
    let (a, b) = (config(1, 7001), config(2, 7002));
    let mut s = SyncState::new(PREFIX, [a.clone(), b.clone()]).with_history(history(20));
    s.apply_list([], at(3));
    assert_eq!(s.take_persist(), None);
    // One is unregistered through the API meanwhile: etcd had nothing to delete.
    s.forget_held(&b.subscription_key());
    assert_eq!(held(&s), vec![a.clone()]);
    assert_eq!(s.accept_held(), vec![Change::Stop(a.subscription_key())]);
    assert!(held(&s).is_empty());
    assert_eq!(s.suspicion(), None);
    assert_eq!(s.registrations(), 0);
    // From now on the new history is recorded.
    assert_eq!(s.take_persist(), history(3));
    // A later listing that still lacks them changes nothing.
    s.resync();
    assert_eq!(s.apply_list([], at(4)), vec![]);
}

#[test]
fn a_resumed_watch_needs_etcd_to_still_hold_the_history_followed() {
    let a = config(1, 7001);
    let mut s = SyncState::new(PREFIX, []);
    s.apply_list([kv(&a, 5)], at(8));
    assert!(s.resumes(&at(8)));
    assert!(s.resumes(&at(30)));
    assert_eq!(s.next_step(), Step::Watch { from: 9 });
    // Wiped and restarted: no epoch (or another one) even at a higher revision.
    let wiped = Listed {
        epoch: None,
        ..at(30)
    };
    assert!(!s.resumes(&wiped));
    assert_eq!(s.next_step(), Step::List);
    let mut s = SyncState::new(PREFIX, []);
    s.apply_list([kv(&a, 5)], at(8));
    assert!(!s.resumes(&at(2)), "behind what was applied");
    // Before any epoch was known, only the revision and the cluster are checked.
    let mut s = SyncState::new(PREFIX, []);
    s.apply_list(
        [],
        Listed {
            epoch: None,
            ..at(1)
        },
    );
    assert!(s.resumes(&Listed {
        epoch: None,
        ..at(1)
    }));
}

#[test]
fn a_watch_created_at_the_current_revision_still_applies_the_event_at_it() {
    let mut s = SyncState::new(PREFIX, []);
    let a = config(1, 7001);
    s.apply_list([], at(2));
    // Reconnected after an outage: the store is at 3 already (a registration made meanwhile),
    // and the watch from 3 reports it after its creation response, whose header says 3.
    assert!(s.watch_created(3, CLUSTER));
    assert_eq!(s.next_step(), Step::Watch { from: 3 });
    assert_eq!(
        s.apply_events([Event::Put(kv(&a, 3))]),
        vec![Change::Start(a)]
    );
    assert_eq!(s.next_step(), Step::Watch { from: 4 });
}
