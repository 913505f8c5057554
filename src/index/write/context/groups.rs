//! The KV-cache groups of an engine rank (`docs/engine-events.md`, "Cache groups"): each group
//! is a holder of its own, `(instance, rank, group)`, whose blocks share the context's keys with
//! the other groups' (vLLM publishes the same hash for a block in every group). Its kind decides
//! how the answer reuses its blocks (`index::read::hybrid`).

use crate::events::Holder;
use crate::index::plan::GroupLayout;
use crate::model::{GroupKind, SubscriptionKey};

use super::ContextIndex;

/// One engine holder's KV-cache group and how many blocks it holds, for `/services/status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupCount {
    pub source: SubscriptionKey,
    pub instance_id: String,
    pub dp_rank: u32,
    pub group: u32,
    pub kind: GroupKind,
    pub blocks: u64,
}

impl ContextIndex {
    /// Every engine holder of a hybrid layout (a group other than group 0 of full attention,
    /// or a rank that has one) with its block count, sorted by instance, rank and group.
    pub fn group_counts(&self) -> Vec<GroupCount> {
        let mut out: Vec<GroupCount> = self
            .holders
            .iter()
            .filter(|h| !h.vacant)
            .filter_map(|h| match &h.key.holder {
                Holder::Engine {
                    instance_id,
                    dp_rank,
                    group,
                } => Some(GroupCount {
                    source: h.key.source.clone(),
                    instance_id: instance_id.clone(),
                    dp_rank: *dp_rank,
                    group: *group,
                    kind: h.kind,
                    blocks: h.live,
                }),
                Holder::Shared { .. } => None,
            })
            .collect();
        let hybrid: std::collections::BTreeSet<(String, u32)> = out
            .iter()
            .filter(|g| g.group != 0 || g.kind != GroupKind::Full)
            .map(|g| (g.instance_id.clone(), g.dp_rank))
            .collect();
        out.retain(|g| hybrid.contains(&(g.instance_id.clone(), g.dp_rank)));
        out.sort_by(|a, b| {
            (&a.instance_id, a.dp_rank, a.group).cmp(&(&b.instance_id, b.dp_rank, b.group))
        });
        out
    }

    /// Holder `id`'s group is of `kind`. A change reaches the metadata (so the next plan
    /// routes the holder by it) and the holder's record at the next checkpoint.
    pub(in crate::index) fn set_group_kind(&mut self, id: u32, kind: GroupKind) {
        let Some(state) = self.holders.get_mut(id as usize) else {
            return;
        };
        if state.kind == kind {
            return;
        }
        state.kind = kind;
        state.written = None;
        let Holder::Engine { group, .. } = state.key.holder else {
            return;
        };
        let mut meta = self.shared.meta.write();
        set_layout(&mut meta.groups, id, group, kind);
    }

    /// The holders an engine's `ClearHolder` empties: every KV-cache group of its (instance,
    /// rank) that `source` reported (an engine clears its whole cache, all groups at once). A
    /// store backend's is itself.
    pub(super) fn cleared_holders(&self, source: &SubscriptionKey, holder: &Holder) -> Vec<u32> {
        let Holder::Engine {
            instance_id,
            dp_rank,
            ..
        } = holder
        else {
            let key = crate::index::write::holder::HolderKey {
                source: source.clone(),
                holder: holder.clone(),
            };
            return self.holder_ids.get(&key).copied().into_iter().collect();
        };
        let Some(ids) = self.by_source.get(source) else {
            return Vec::new();
        };
        ids.iter()
            .copied()
            .filter(|&id| {
                self.holders.get(id as usize).is_some_and(|state| {
                    !state.vacant
                        && matches!(&state.key.holder, Holder::Engine { instance_id: i, dp_rank: r, .. }
                            if i == instance_id && r == dp_rank)
                })
            })
            .collect()
    }
}

/// Record holder `id`'s group in the metadata's layouts: group 0 of full attention (the
/// single-group model) is the default and takes no entry.
pub(in crate::index) fn set_layout(
    layouts: &mut std::collections::BTreeMap<u32, GroupLayout>,
    id: u32,
    idx: u32,
    kind: GroupKind,
) {
    if idx == 0 && kind == GroupKind::Full {
        layouts.remove(&id);
    } else {
        layouts.insert(id, GroupLayout { idx, kind });
    }
}
