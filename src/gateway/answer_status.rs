//! How sure a query's answer is, per instance and rank (`include_status`; the rules are in
//! `docs/engine-events.md`, "Cache groups", and `docs/python-api.md`): `exact` when it is what
//! the engine itself would reuse, `upper_bound` or `lower_bound` with a short reason when the
//! events cannot decide it, and beside it the state and lag of the subscription that feeds the
//! rank, so a router can tell a stale answer from a settled one.

use std::collections::BTreeMap;

use crate::index::{Certainty, GroupLayout, RankStatus};
use crate::model::{ContextKey, SubscriptionKey};
use crate::registry::ServiceInfo;
use crate::subscription::status::HashCheckState;

/// What a declared SGLang hybrid's answer can be: SGLang evicts a hybrid's window and Mamba
/// parts without an event, so the full-attention prefix its events show is at least the truth.
pub const SGLANG_HYBRID: &str =
    "SGLang hybrid model: window and Mamba state are evicted without events";

/// A registration's `cache_group` keeps one group of a hybrid model: the others' rules are
/// not applied.
pub const ONE_GROUP: &str = "the registration's cache_group indexes one KV-cache group only";

/// A hybrid rank whose engine hashes with another recipe than the registered one: a window or
/// Mamba store that no full-attention store of its step places (a layout without full
/// attention, a state stored again alone) is kept under its published hashes, which the query's
/// chain of the registered recipe does not find.
pub const UNPLACED: &str = "the registered hash_profile does not reproduce the engine's hashes: \
     window or Mamba blocks stored without a full-attention sibling may be missed";

/// One rank's status in an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankAnswerStatus {
    pub dp_rank: u32,
    pub certainty: Certainty,
    /// The registration's subscription state (`live`, `replaying`, ...), `None` for a rank no
    /// registration of this tenant feeds (a store's blocks, a registration just removed).
    pub state: Option<&'static str>,
    /// Milliseconds since the subscription's last batch.
    pub lag_ms: Option<u64>,
    pub groups: Vec<GroupLayout>,
}

/// One instance's status: its ranks', and the instance's own (exact only when every rank is).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceAnswerStatus {
    pub certainty: Certainty,
    pub ranks: Vec<RankAnswerStatus>,
}

/// The statuses of a context's ranks (`ranks`, from its plan) with the subscriptions of
/// `services` that feed them, keyed by instance id.
pub fn statuses(
    context: &ContextKey,
    ranks: Vec<RankStatus>,
    services: &[ServiceInfo],
    now_ms: u64,
) -> BTreeMap<String, InstanceAnswerStatus> {
    let by_key: BTreeMap<SubscriptionKey, &ServiceInfo> = services
        .iter()
        .map(|s| (s.config.subscription_key(), s))
        .collect();
    let mut out: BTreeMap<String, InstanceAnswerStatus> = BTreeMap::new();
    for rank in ranks {
        let key = SubscriptionKey::new(&rank.instance_id, &context.tenant_id, rank.dp_rank);
        let service = by_key.get(&key);
        let mut certainty = rank.certainty;
        if certainty == Certainty::Exact
            && let Some(s) = service
        {
            if !s.config.hybrid_parts.is_empty() {
                certainty = Certainty::UpperBound {
                    reason: SGLANG_HYBRID,
                };
            } else if s.config.cache_group.is_some() && (!rank.groups.is_empty() || other_groups(s))
            {
                certainty = Certainty::UpperBound { reason: ONE_GROUP };
            } else if !rank.groups.is_empty() && s.status.hash_check == HashCheckState::Mismatch {
                certainty = Certainty::LowerBound { reason: UNPLACED };
            }
        }
        let status = RankAnswerStatus {
            dp_rank: rank.dp_rank,
            certainty,
            state: service.map(|s| s.status.phase_name()),
            lag_ms: service
                .and_then(|s| s.status.last_batch_ts_ms)
                .map(|ts| now_ms.saturating_sub(ts)),
            groups: rank.groups,
        };
        let instance = out
            .entry(rank.instance_id)
            .or_insert_with(|| InstanceAnswerStatus {
                certainty: Certainty::Exact,
                ranks: Vec::new(),
            });
        instance.certainty = combined(instance.certainty, status.certainty);
        instance.ranks.push(status);
    }
    out
}

/// Whether the subscription left events of other KV-cache groups out (its `cache_group`): the
/// model is a hybrid even when the group it keeps is group 0 of full attention.
fn other_groups(service: &ServiceInfo) -> bool {
    let reason = crate::events::IgnoreReason::OtherCacheGroup.as_str();
    service.status.ignored.get(reason).is_some_and(|&n| n > 0)
}

/// An instance's status from its ranks': exact when both are, the bound when only one is a
/// bound or both are the same kind of bound. An instance's figures are its ranks' maxima, so
/// an upper bound beside a lower bound bounds nothing: the instance's is the upper bound's
/// kind with a reason that says so.
fn combined(a: Certainty, b: Certainty) -> Certainty {
    match (a, b) {
        (Certainty::Exact, x) | (x, Certainty::Exact) => x,
        (Certainty::UpperBound { .. }, Certainty::UpperBound { .. })
        | (Certainty::LowerBound { .. }, Certainty::LowerBound { .. }) => a,
        _ => Certainty::UpperBound {
            reason: "its ranks' answers bound the truth from different sides: see ranks",
        },
    }
}

/// The `status` entry of an answer: instance id → `{status, reason, ranks: {rank: {status,
/// reason, state, lag_ms, groups}}}`.
pub fn to_json(statuses: &BTreeMap<String, InstanceAnswerStatus>) -> serde_json::Value {
    use serde_json::json;
    let instances: serde_json::Map<String, serde_json::Value> = statuses
        .iter()
        .map(|(id, s)| {
            let ranks: serde_json::Map<String, serde_json::Value> = s
                .ranks
                .iter()
                .map(|r| {
                    let groups: Vec<serde_json::Value> = (r.groups.iter())
                        .map(|g| {
                            json!({"group": g.idx, "kind": g.kind.family(),
                                   "sliding_window": g.kind.window()})
                        })
                        .collect();
                    let body = json!({
                        "status": r.certainty.as_str(), "reason": r.certainty.reason(),
                        "state": r.state, "lag_ms": r.lag_ms, "groups": groups,
                    });
                    (r.dp_rank.to_string(), body)
                })
                .collect();
            let body = json!({
                "status": s.certainty.as_str(), "reason": s.certainty.reason(), "ranks": ranks,
            });
            (id.clone(), body)
        })
        .collect();
    serde_json::Value::Object(instances)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_instance_is_exact_only_when_every_rank_is() {
        let up = Certainty::UpperBound { reason: "u" };
        let low = Certainty::LowerBound { reason: "l" };
        assert_eq!(
            combined(Certainty::Exact, Certainty::Exact),
            Certainty::Exact
        );
        assert_eq!(combined(Certainty::Exact, up), up);
        assert_eq!(combined(low, Certainty::Exact), low);
        assert_eq!(combined(low, low), low);
        assert_eq!(combined(up, low).as_str(), "upper_bound");
        assert!(combined(up, low).reason().contains("different sides"));
    }
}
