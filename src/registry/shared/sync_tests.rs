//! The etcd sync rules: listings diff against what runs, watch events apply once and in order,
//! anything under the prefix that is not a registration is ignored, compaction forces a list.

use super::*;
use crate::durability::codec::registration_value;

const PREFIX: &str = "/mc/";

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
    let changes = s.apply_list([kv(&a, 3), kv(&b, 5)], 9);
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
    let changes = s.apply_list([kv(&kept, 2), kv(&changed_now, 4)], 4);
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
        s.apply_list([kv(&b, 3)], 3),
        vec![Change::Stop(a.subscription_key()), Change::Start(b)]
    );
}

#[test]
fn watch_events_start_change_and_stop() {
    let mut s = SyncState::new(PREFIX, []);
    s.apply_list([], 1);
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
    s.apply_list([kv(&a, 5)], 7);
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
    s.apply_list([], 3);
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
    let changes = s.apply_list([wrong_key, not_json.clone(), not_utf8_key, elsewhere], 5);
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
    s.apply_list([kv(&a, 2)], 2);
    s.resync();
    assert_eq!(s.next_step(), Step::List);
    // Meanwhile a was deleted and b registered; the history of both is gone.
    let changes = s.apply_list([kv(&b, 30)], 31);
    assert_eq!(
        changes,
        vec![Change::Stop(a.subscription_key()), Change::Start(b)]
    );
    assert_eq!(s.next_step(), Step::Watch { from: 32 });
}

#[test]
fn an_etcd_whose_store_went_back_is_listed_again_and_the_listing_wins() {
    let mut s = SyncState::new(PREFIX, []);
    let (a, b) = (config(1, 7001), config(2, 7002));
    s.apply_list([kv(&a, 40)], 50);
    assert!(s.watch_created(50));
    assert!(s.watch_created(60));
    // A new cluster at revision 3: watching from 51 would wait for unrelated history.
    assert!(!s.watch_created(3));
    assert_eq!(s.next_step(), Step::List);
    let changes = s.apply_list([kv(&b, 2)], 3);
    assert_eq!(
        changes,
        vec![Change::Stop(a.subscription_key()), Change::Start(b)]
    );
    assert_eq!(s.next_step(), Step::Watch { from: 4 });
}

#[test]
fn a_watch_created_at_the_current_revision_still_applies_the_event_at_it() {
    let mut s = SyncState::new(PREFIX, []);
    let a = config(1, 7001);
    s.apply_list([], 2);
    // Reconnected after an outage: the store is at 3 already (a registration made meanwhile),
    // and the watch from 3 reports it after its creation response, whose header says 3.
    assert!(s.watch_created(3));
    assert_eq!(s.next_step(), Step::Watch { from: 3 });
    assert_eq!(
        s.apply_events([Event::Put(kv(&a, 3))]),
        vec![Change::Start(a)]
    );
    assert_eq!(s.next_step(), Step::Watch { from: 4 });
}
