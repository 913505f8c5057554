use super::*;
use crate::durability::codec;
use crate::replica::cut_tests::registration;

fn limits() -> Limits {
    Limits {
        deadline: Duration::from_secs(1),
        max_registrations: 4,
        max_contexts: 8,
        max_name_bytes: 16,
        max_bytes: 1000,
    }
}

fn begin(records: u64, pairs: u64, contexts: u64, registrations: u64) -> pb::SnapshotBegin {
    pb::SnapshotBegin {
        format: FORMAT,
        records,
        pairs,
        contexts,
        registrations,
        replica_id: "peer".into(),
        sources: Vec::new(),
        chain_tuning: 0,
    }
}

fn record(cf: Cf, key: Vec<u8>, value: Vec<u8>) -> pb::SnapshotRecord {
    pb::SnapshotRecord {
        cf: format::cf_code(cf).expect("code"),
        key,
        value,
    }
}

fn refusal(r: Result<Cf, Refused>) -> (bool, String) {
    match r {
        Ok(cf) => panic!("accepted as {cf:?}"),
        Err(Refused::Bad(m)) => (false, m),
        Err(Refused::OverLimit(m)) => (true, m),
    }
}

#[test]
fn counts_beyond_what_this_replica_holds_are_refused_at_the_begin_mark() {
    let l = limits();
    assert_eq!(l.check_announced(&begin(10, 5, 8, 4)), Ok(()));
    let cases = [
        (
            begin(u64::MAX, 5, 1, 1 << 40),
            "registrations",
            "max_subscriptions",
        ),
        (
            begin(u64::MAX, 5, u64::MAX, 1),
            "contexts",
            "max_contexts_per_source",
        ),
        (
            begin(u64::MAX, u64::MAX / 2, 1, 1),
            "pairs",
            "bootstrap_max_bytes",
        ),
    ];
    for (announced, what, key) in cases {
        let e = l.check_announced(&announced).unwrap_err();
        assert!(e.contains(what) && e.contains(key), "{e}");
    }
    let mut named = begin(1, 0, 1, 1);
    named.sources.push(pb::SourcePosition {
        instance_id: "x".repeat(17),
        tenant_id: String::new(),
        dp_rank: 0,
        seq: 1,
        digest: 1,
    });
    let e = l.check_announced(&named).unwrap_err();
    assert!(e.contains("max_name_bytes"), "{e}");
}

#[test]
fn records_beyond_the_bounds_or_the_announcement_are_refused_as_they_arrive() {
    let l = limits();
    let announced = begin(100, 50, 1, 1);
    let mut tally = Tally::new(&l);
    let (over, e) = refusal(tally.record(&announced, &record(Cf::Pairs, vec![1; 200], vec![1])));
    assert!(over && e.contains("longer than any this store has"), "{e}");
    // A key the clearing of a failed attempt would not reach.
    let (over, e) = refusal(tally.record(&announced, &record(Cf::Pairs, vec![0xff; 64], vec![])));
    assert!(!over && e.contains("no record of this store has"), "{e}");
    assert_eq!(
        tally
            .record(&announced, &record(Cf::Contexts, vec![1; 8], vec![1]))
            .ok(),
        Some(Cf::Contexts)
    );
    let (over, e) = refusal(tally.record(&announced, &record(Cf::Contexts, vec![2; 8], vec![1])));
    assert!(
        !over && e.contains("more contexts than the 1 announced"),
        "{e}"
    );
    let (over, e) =
        refusal(tally.record(&announced, &record(Cf::Pairs, vec![3; 20], vec![0; 990])));
    assert!(over && e.contains("bootstrap_max_bytes"), "{e}");
}

#[test]
fn registrations_are_checked_against_local_names_and_only_their_sources_kept() {
    let l = Limits {
        max_bytes: 1 << 20,
        ..limits()
    };
    let announced = begin(3, 0, 0, 2);
    let mut tally = Tally::new(&l);
    let config = registration(0);
    let value = codec::local_registration_value(&config, 7);
    let key = config.subscription_key().to_string().into_bytes();
    assert_eq!(
        tally
            .record(&announced, &record(Cf::Registrations, key.clone(), value))
            .ok(),
        Some(Cf::Registrations)
    );
    assert_eq!(tally.registered, vec![(config.subscription_key(), 7)]);
    let mut long = registration(1);
    long.model_name = "m".repeat(17);
    let value = codec::local_registration_value(&long, 1);
    let (over, e) =
        refusal(tally.record(&announced, &record(Cf::Registrations, key.clone(), value)));
    assert!(over && e.contains("max_name_bytes"), "{e}");
    let value = codec::local_registration_value(&registration(2), 1);
    tally
        .record(
            &announced,
            &record(Cf::Registrations, key.clone(), value.clone()),
        )
        .ok()
        .expect("the second announced");
    let (_, e) = refusal(tally.record(&announced, &record(Cf::Registrations, key, value)));
    assert!(e.contains("more registrations than the 2 announced"), "{e}");
}
