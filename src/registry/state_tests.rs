//! The registry's state changes without actors: what `Register`, `Unregister`, `ListServices`
//! and `Refusals` decide.

use std::sync::Arc;

use super::*;
use crate::error::Code;
use crate::gateway::registration::PYTHON_NAMES;

fn config(instance: &str, rank: u32, port: u16) -> PublisherConfig {
    PublisherConfig {
        dp_rank: rank,
        ..PublisherConfig::test_vllm(instance, &format!("tcp://127.0.0.1:{port}"))
    }
}

/// Register as the actor does once the checks pass; the subscription handle is a name.
fn register(
    state: &mut RegistryState<&'static str>,
    config: PublisherConfig,
    subscription: &'static str,
) -> Result<RegisterOutcome, OpError> {
    if let Some(outcome) = state.check(&config, PYTHON_NAMES, None)? {
        return Ok(outcome);
    }
    state.insert(Arc::new(config), StatusCell::default(), subscription);
    Ok(RegisterOutcome::Created)
}

#[test]
fn a_registration_is_created_once_and_an_identical_one_changes_nothing() {
    let mut state = RegistryState::default();
    assert_eq!(
        register(&mut state, config("a", 0, 5000), "first"),
        Ok(RegisterOutcome::Created)
    );
    assert_eq!(
        register(&mut state, config("a", 0, 5000), "second"),
        Ok(RegisterOutcome::Unchanged)
    );
    let services = state.services();
    assert_eq!(services.len(), 1);
    assert_eq!(services[0].subscription, "first", "the running one stays");
}

#[test]
fn a_key_or_an_endpoint_in_use_is_a_conflict_naming_it() {
    let mut state = RegistryState::default();
    register(&mut state, config("a", 0, 5000), "a").unwrap();
    let e = register(&mut state, config("a", 0, 5001), "x").unwrap_err();
    assert_eq!(e.code, Code::InvalidParams);
    assert_eq!(
        e.message,
        "conflicting registration for service key: a|default|0"
    );
    let e = register(&mut state, config("b", 0, 5000), "x").unwrap_err();
    assert_eq!(
        e.message,
        "conflicting active registration for endpoint: tcp://127.0.0.1:5000 (used by a|default|0)"
    );
    // Once removed, both the key and the endpoint are free.
    let removed = state.remove(&config("a", 0, 5000).subscription_key());
    assert_eq!(removed.map(|e| e.subscription), Some("a"));
    assert!(!state.contains(&config("a", 0, 5000).subscription_key()));
    assert_eq!(
        register(&mut state, config("b", 0, 5000), "b"),
        Ok(RegisterOutcome::Created)
    );
    assert!(
        state
            .remove(&config("a", 0, 5000).subscription_key())
            .is_none()
    );
}

#[test]
fn refusals_by_the_policy_are_counted_by_label() {
    let policy = RegistrationPolicy {
        max_subscriptions: 1,
        ..Default::default()
    };
    let mut state = RegistryState::default().with_policy(policy);
    register(&mut state, config("a", 0, 5000), "a").unwrap();
    for port in [5001, 5002] {
        let e = register(&mut state, config("b", 0, port), "b").unwrap_err();
        assert!(e.message.contains("max_subscriptions"), "{}", e.message);
    }
    let long = "x".repeat(RegistrationPolicy::default().max_name_bytes + 1);
    let e = register(&mut state, config(&long, 0, 5003), "c").unwrap_err();
    assert_eq!(e.field.as_deref(), Some("instance_id"));
    assert_eq!(state.refusals().values().sum::<u64>(), 3);
    assert_eq!(state.refusals().len(), 2, "{:?}", state.refusals());
    // An identical registration is not a new subscription: no capacity is needed for it.
    assert_eq!(
        register(&mut state, config("a", 0, 5000), "a"),
        Ok(RegisterOutcome::Unchanged)
    );
}

#[test]
fn a_context_bound_to_another_profile_refuses_the_registration() {
    let mut state: RegistryState<()> = RegistryState::default();
    let registering = config("a", 0, 5000);
    let other = HashProfile::resolve(
        Some("vllm_v1"),
        Some("sha256_cbor"),
        Some("1"),
        Some("low64_be"),
    )
    .unwrap();
    let e = state
        .check(&registering, PYTHON_NAMES, Some(&other))
        .unwrap_err();
    assert_eq!(e.code, Code::InvalidParams);
    let conflict = ProfileConflict {
        key: registering.context_key(),
        existing: other.to_string(),
        requested: registering.hash_profile.to_string(),
    };
    assert_eq!(e.message, conflict.to_string());
    assert_eq!(
        state.check(&registering, PYTHON_NAMES, Some(&registering.hash_profile)),
        Ok(None)
    );
    assert!(
        state.refusals().is_empty(),
        "a conflict is not a policy refusal"
    );
}

#[test]
fn services_are_listed_by_rendered_key() {
    let mut state = RegistryState::default();
    register(&mut state, config("a", 2, 5000), "a2").unwrap();
    register(&mut state, config("a", 10, 5001), "a10").unwrap();
    register(&mut state, config("a-b", 0, 5002), "a-b").unwrap();
    let order: Vec<&str> = state.services().iter().map(|e| e.subscription).collect();
    // "a-b|…" < "a|default|10" < "a|default|2", as text.
    assert_eq!(order, ["a-b", "a10", "a2"]);
}
