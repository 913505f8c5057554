//! Unit tests of the router: contexts per adapter and store object, block rules, and the
//! bounds on what one source's events may create.

use super::*;
use crate::events::{EngineRemoved, EngineStored};
use crate::hashing::HashProfile;
use crate::model::{BlockHash, PublisherType, Tier};

fn config(lora: &str, kind: PublisherType) -> PublisherConfig {
    let profile = crate::hashing::profile::vllm_cbor_default();
    PublisherConfig {
        instance_id: "i".into(),
        endpoint: "tcp://127.0.0.1:1".into(),
        replay_endpoint: String::new(),
        publisher_type: kind,
        model_name: "m".into(),
        lora_name: lora.into(),
        tenant_id: "default".into(),
        block_size: 16,
        dp_rank: 2,
        cache_group: None,
        hybrid_parts: Vec::new(),
        hash_profile: profile,
    }
}

fn stored(lora: Option<&str>, block_size: u32) -> KvEvent {
    KvEvent::Stored(EngineStored {
        hashes: vec![BlockHash(1)],
        parent: None,
        tokens: None,
        block_size,
        lora_name: lora.map(str::to_owned),
        cache_salt: None,
        extras: Vec::new(),
        extras_carried: true,
        tier: Tier::Device,
        group: Default::default(),
    })
}

fn route(router: &mut Router, events: Vec<KvEvent>) -> (Vec<String>, Vec<IgnoreReason>) {
    let mut ignored = Vec::new();
    let batch = DecodedBatch {
        events,
        ..Default::default()
    };
    let routed = router.route(batch, &mut ignored);
    (
        routed
            .iter()
            .map(|(c, ops)| format!("{}:{}", c.lora_name, ops.len()))
            .collect(),
        ignored,
    )
}

#[test]
fn a_base_registration_indexes_every_adapter_in_its_own_context() {
    let mut r = Router::new(&config("", PublisherType::Vllm));
    let (routed, ignored) = route(
        &mut r,
        vec![
            stored(None, 16),
            stored(Some("ad"), 16),
            stored(Some(""), 16),
        ],
    );
    assert_eq!(routed, [":2", "ad:1"]);
    assert!(ignored.is_empty());
    // Removals and clears carry no adapter: they go to every context this source fed.
    let removed = KvEvent::Removed(EngineRemoved {
        hashes: vec![BlockHash(1)],
        tier: Tier::Device,
        group: 0,
    });
    let (routed, _) = route(&mut r, vec![removed, KvEvent::AllCleared]);
    assert_eq!(routed, [":2", "ad:2"]);
}

#[test]
fn an_adapter_registration_accepts_only_its_adapter() {
    let mut r = Router::new(&config("ad", PublisherType::Vllm));
    let (routed, ignored) = route(
        &mut r,
        vec![
            stored(Some("ad"), 16),
            stored(Some("other"), 16),
            stored(None, 16),
        ],
    );
    assert_eq!(routed, ["ad:1"]);
    assert_eq!(ignored, [IgnoreReason::OtherLora, IgnoreReason::OtherLora]);
}

#[test]
fn another_block_size_is_ignored_for_vllm() {
    let mut r = Router::new(&config("", PublisherType::Vllm));
    let (routed, ignored) = route(&mut r, vec![stored(None, 8)]);
    assert!(routed.is_empty());
    assert_eq!(ignored, [IgnoreReason::BlockSizeMismatch]);
}

fn object(tenant: &str, model: Option<&str>, block_size: Option<u32>) -> StoreObject {
    StoreObject {
        backend_id: "b".into(),
        object_key: "o".into(),
        tenant_id: tenant.into(),
        model_name: model.map(str::to_owned),
        lora_name: None,
        block_size,
        tier: Tier::CpuShare,
        hashes: vec![BlockHash(9)],
    }
}

fn store_router(tenant: &str) -> Router {
    let mut cfg = config("", PublisherType::Mooncake);
    cfg.tenant_id = tenant.into();
    Router::new(&cfg)
}

fn names(routed: &Routed) -> Vec<String> {
    routed
        .iter()
        .map(|(c, ops)| format!("{c}:{}", ops.len()))
        .collect()
}

fn fields(refused: &[Refused]) -> Vec<&'static str> {
    refused.iter().map(|r| r.field).collect()
}

#[test]
fn store_events_name_their_context_and_clears_follow_the_tenant() {
    let mut r = store_router("t1");
    let mut ignored = Vec::new();
    let batch = DecodedBatch {
        events: vec![
            KvEvent::StoreStored(object("t1", Some("x"), Some(32))),
            KvEvent::StoreStored(object("t1", None, Some(32))),
            KvEvent::StoreCleared {
                backend_id: "b".into(),
                tenant_id: "t1".into(),
            },
        ],
        ..Default::default()
    };
    let routed = r.route(batch, &mut ignored);
    assert_eq!(
        names(&routed),
        ["t1/x//32:2", "t1/m//32:2"],
        "model falls back to the registration's"
    );
    assert!(r.take_refused().is_empty());
}

#[test]
fn a_store_is_confined_to_its_tenant_and_to_valid_block_sizes() {
    let mut r = store_router("t1");
    let mut ignored = Vec::new();
    let batch = DecodedBatch {
        events: vec![
            KvEvent::StoreStored(object("intruder", Some("x"), Some(32))),
            KvEvent::StoreStored(object("", Some("x"), Some(32))),
            KvEvent::StoreStored(object("t1", Some("x"), Some(0))),
            KvEvent::StoreStored(object("t1", Some("x"), Some((1 << 20) + 1))),
            KvEvent::StoreStored(object("t1", Some("x"), None)),
            KvEvent::StoreRemoved(object("intruder", Some("x"), Some(32))),
            KvEvent::StoreCleared {
                backend_id: "b".into(),
                tenant_id: "intruder".into(),
            },
        ],
        ..Default::default()
    };
    let routed = r.route(batch, &mut ignored);
    assert_eq!(
        names(&routed),
        ["t1/x//16:1"],
        "the good event still routes"
    );
    assert_eq!(
        fields(&r.take_refused()),
        [
            "tenant_id",
            "tenant_id",
            "block_size",
            "block_size",
            "tenant_id",
            "tenant_id"
        ]
    );
    assert!(ignored.is_empty());
    // A default-tenant store accepts events without a tenant.
    let mut r = store_router("default");
    let routed = r.route(
        DecodedBatch {
            events: vec![KvEvent::StoreStored(object("", None, None))],
            ..Default::default()
        },
        &mut ignored,
    );
    assert_eq!(names(&routed), ["default/m//16:1"]);
}

#[test]
fn a_removal_never_creates_a_context() {
    let mut r = store_router("t1");
    let routed = r.route(
        DecodedBatch {
            events: vec![KvEvent::StoreRemoved(object("t1", Some("x"), Some(32)))],
            ..Default::default()
        },
        &mut Vec::new(),
    );
    assert!(routed.is_empty());
}

#[test]
fn one_source_feeds_at_most_max_contexts() {
    let limits = RouteLimits {
        max_contexts: 2,
        max_name_bytes: 8,
        ..RouteLimits::default()
    };
    let mut r = Router::new(&config("", PublisherType::Vllm)).with_limits(limits);
    let (routed, ignored) = route(
        &mut r,
        vec![
            stored(Some("a"), 16),
            stored(Some("b"), 16),
            stored(None, 16),
            stored(Some("a"), 16),
            stored(Some("adapter-name-too-long"), 16),
        ],
    );
    assert_eq!(
        routed,
        ["a:2", ":1"],
        "the base context was fed from the start"
    );
    assert!(ignored.is_empty());
    let refused = r.take_refused();
    assert_eq!(fields(&refused), ["max_contexts_per_source", "lora_name"]);
    assert!(
        refused[0].detail.contains("max_contexts_per_source = 2"),
        "{refused:?}"
    );
    assert!(r.take_refused().is_empty(), "taken");

    let mut r = store_router("t1").with_limits(limits);
    let long = "m".repeat(10_000);
    let mut ignored = Vec::new();
    r.route(
        DecodedBatch {
            events: vec![KvEvent::StoreStored(object("t1", Some(&long), Some(16)))],
            ..Default::default()
        },
        &mut ignored,
    );
    let refused = r.take_refused();
    assert_eq!(fields(&refused), ["model_name"]);
    assert!(
        refused[0].detail.len() < 200,
        "a preview only: {}",
        refused[0].detail
    );
}

fn backend(tenant: &str, model: &str, backend_id: &str) -> KvEvent {
    let mut o = object(tenant, Some(model), Some(16));
    o.backend_id = backend_id.into();
    KvEvent::StoreStored(o)
}

#[test]
fn a_store_makes_at_most_max_holders_backends_per_context_each_named_within_bounds() {
    let limits = RouteLimits {
        max_holders: 2,
        max_name_bytes: 8,
        ..RouteLimits::default()
    };
    let mut r = store_router("t1").with_limits(limits);
    let events = vec![
        backend("t1", "x", "n0"),
        backend("t1", "x", "n1"),
        backend("t1", "x", "n2"),
        backend("t1", "x", "n0"),
        backend("t1", "y", "n2"),
        backend("t1", "x", &"n".repeat(9)),
        // Removals and clears of a refused backend find no holder and make none.
        KvEvent::StoreRemoved(object("t1", Some("x"), Some(16))),
    ];
    let routed = r.route(
        DecodedBatch {
            events,
            ..Default::default()
        },
        &mut Vec::new(),
    );
    // Two backends in x (n0 twice), one in y: the cap is per context.
    assert_eq!(names(&routed), ["t1/x//16:4", "t1/y//16:1"]);
    let refused = r.take_refused();
    assert_eq!(fields(&refused), ["max_holders_per_context", "backend_id"]);
    assert!(
        refused[0].detail.contains("max_holders_per_context = 2"),
        "{refused:?}"
    );
    assert!(refused[1].detail.contains("max_name_bytes"), "{refused:?}");
}

/// Route one stored event of `strategy` and apply it to a fresh context of that profile;
/// the answer for the same prompt tokens from a query.
fn ingest_then_query(profile: HashProfile, stored: EngineStored, query: &[i32]) -> u64 {
    let mut cfg = config("", PublisherType::Sglang);
    cfg.hash_profile = profile.clone();
    cfg.block_size = 4;
    let mut r = Router::new(&cfg);
    let batch = DecodedBatch {
        events: vec![KvEvent::Stored(stored)],
        ..Default::default()
    };
    let routed = r.route(batch, &mut Vec::new());
    let (key, ops) = routed.into_iter().next().expect("one context");
    assert!(
        matches!(ops[0], IndexOp::StoreChained { .. }),
        "{:?}",
        ops[0]
    );
    let mut index = crate::index::ContextIndex::new(key, profile);
    index.apply(&crate::events::IndexBatch {
        source: cfg.subscription_key(),
        ops,
    });
    let hits = index.reader().query_tokens(query, "", None);
    hits.hits["i"].rank_matches[&2].device
}

fn engine_event(tokens: EventTokens, n_hashes: u64, block_size: u32) -> EngineStored {
    EngineStored {
        hashes: (0..n_hashes).map(|h| BlockHash(0xabc0 + h)).collect(),
        parent: None,
        tokens: Some(tokens),
        block_size,
        lora_name: None,
        cache_salt: None,
        extras: Vec::new(),
        extras_carried: true,
        tier: Tier::Device,
        group: Default::default(),
    }
}

#[test]
fn ingested_contents_and_query_tokens_give_the_same_keys() {
    let vllm = config("", PublisherType::Vllm).hash_profile;
    let tokens: Vec<i64> = (1..=8).collect();
    let query: Vec<i32> = (1..=10).collect();
    let event = engine_event(EventTokens::Flat(tokens.clone()), 2, 4);
    assert_eq!(ingest_then_query(vllm, event, &query), 8);

    // SGLang: a short final page of two tokens is its own block.
    let sglang =
        HashProfile::resolve(Some("sglang"), Some("sha256_raw"), None, Some("first64_be")).unwrap();
    let event = engine_event(EventTokens::Flat((1..=10).collect()), 3, 4);
    assert_eq!(ingest_then_query(sglang, event, &query), 10);

    // Bigram: 10 tokens are 9 pairs, pages of 4 pairs, the last one short.
    let bigram = HashProfile::resolve(
        Some("sglang_bigram"),
        Some("sha256_raw"),
        None,
        Some("first64_be"),
    )
    .unwrap();
    let pairs: Vec<(i64, i64)> = (1..10).map(|t| (t, t + 1)).collect();
    let event = engine_event(EventTokens::Bigram(pairs), 3, 4);
    assert_eq!(ingest_then_query(bigram, event, &query), 9);
}

#[test]
fn contents_that_do_not_split_into_the_published_blocks_are_not_used() {
    let rule = BlockRule::FullBlocks;
    let short = engine_event(EventTokens::Flat((1..=7).collect()), 2, 4);
    assert_eq!(
        block_contents(rule, &short),
        None,
        "7 tokens are not 2 full blocks"
    );
    let extra = engine_event(EventTokens::Flat((1..=12).collect()), 2, 4);
    assert_eq!(block_contents(rule, &extra), None, "12 tokens are 3 blocks");
    let pairs = engine_event(EventTokens::Bigram(vec![(1, 2)]), 1, 4);
    assert_eq!(
        block_contents(rule, &pairs),
        None,
        "pairs under a flat rule"
    );
    let mut no_tokens = engine_event(EventTokens::Flat(vec![]), 1, 4);
    no_tokens.tokens = None;
    assert_eq!(block_contents(rule, &no_tokens), None);
    let mut salted = engine_event(EventTokens::Flat((1..=4).collect()), 1, 4);
    salted.cache_salt = Some("s".into());
    assert_eq!(
        block_contents(rule, &salted).unwrap().root,
        derived::root("s")
    );
}

/// A prompt of 8 tokens as an engine hashing with `profile`, `lora` and `salt` publishes it in
/// one event, without `extra_keys`.
fn unsaid_event(profile: &HashProfile, lora: &str, salt: &str) -> EngineStored {
    let tokens: Vec<i64> = (1..=8).collect();
    let hasher = profile.hasher(lora, salt);
    let mut chain = hasher.chain(4, &tokens);
    EngineStored {
        hashes: (0..2).map(|i| chain.try_key(i).unwrap()).collect(),
        lora_name: (!lora.is_empty()).then(|| lora.to_owned()),
        extras_carried: false,
        ..engine_event(EventTokens::Flat(tokens.clone()), 2, 4)
    }
}

#[test]
fn an_event_without_its_extras_is_keyed_by_contents_only_when_the_profile_proves_it_plain() {
    let mut cfg = config("", PublisherType::Vllm);
    cfg.block_size = 4;
    let profile = cfg.hash_profile.clone();
    let query: Vec<i32> = (1..=8).collect();
    for lora in ["", "ad"] {
        let mut r = Router::new(&cfg);
        let batch = DecodedBatch {
            events: vec![
                KvEvent::Stored(unsaid_event(&profile, lora, "s1")),
                KvEvent::Stored(unsaid_event(&profile, lora, "")),
            ],
            ..Default::default()
        };
        let routed = r.route(batch, &mut Vec::new());
        let (key, ops) = routed.into_iter().next().expect("one context");
        assert_eq!(key.lora_name, lora);
        assert!(
            matches!(
                ops.as_slice(),
                [IndexOp::StoreAliased { .. }, IndexOp::StoreChained { .. }]
            ),
            "salted: by published hash; plain: proven, by contents: {ops:?}"
        );
        assert_eq!(r.take_kept_as_published(), 2, "the salted event's blocks");
        assert_eq!(r.take_kept_as_published(), 0, "taken");

        // Only the salted event, applied: found with its salt (through the registered
        // profile), not without one nor with another.
        let mut index = crate::index::ContextIndex::new(key, profile.clone());
        index.apply(&crate::events::IndexBatch {
            source: cfg.subscription_key(),
            ops: ops[..1].to_vec(),
        });
        let device = |salt: &str| {
            let hits = index.reader().query_tokens(&query, salt, None);
            hits.hits["i"].rank_matches[&2].device
        };
        assert_eq!(
            (device("s1"), device(""), device("s2")),
            (8, 0, 0),
            "{lora:?}"
        );
    }

    // A clear forgets what was proven: a continuation of a block proven before it is not.
    let mut r = Router::new(&cfg);
    let whole = unsaid_event(&profile, "", "");
    let first = EngineStored {
        hashes: whole.hashes[..1].to_vec(),
        tokens: Some(EventTokens::Flat((1..=4).collect())),
        ..whole.clone()
    };
    let next = EngineStored {
        hashes: whole.hashes[1..].to_vec(),
        parent: Some(whole.hashes[0]),
        tokens: Some(EventTokens::Flat((5..=8).collect())),
        ..whole.clone()
    };
    let kinds = |r: &mut Router, events: Vec<KvEvent>| -> Vec<&'static str> {
        let batch = DecodedBatch {
            events,
            ..Default::default()
        };
        let routed = r.route(batch, &mut Vec::new());
        routed
            .into_iter()
            .flat_map(|(_, ops)| ops)
            .map(|op| match op {
                IndexOp::StoreChained { .. } => "chained",
                IndexOp::StoreAliased { .. } => "aliased",
                _ => "other",
            })
            .collect()
    };
    let events = vec![
        KvEvent::Stored(first),
        KvEvent::Stored(next.clone()),
        KvEvent::AllCleared,
        KvEvent::Stored(next),
    ];
    assert_eq!(
        kinds(&mut r, events),
        ["chained", "chained", "other", "aliased"]
    );
    assert_eq!(r.take_kept_as_published(), 1);
}
