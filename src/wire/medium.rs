//! The one medium → tier table (`docs/engine-events.md`, "Media and tiers").
//!
//! Engines and the Mooncake store name media differently; matching is ASCII case-insensitive
//! everywhere because the same engine has sent both cases (vLLM `"CPU"` from its offload layer,
//! `"cpu"` from the mooncake-store connector). A name missing here maps to no tier: the decoder
//! counts the event as [`IgnoreReason::UnknownMedium`](crate::events::IgnoreReason) rather than
//! guessing, because a wrong tier is a false hit.

use crate::model::Tier;

/// Engine (vLLM / SGLang) media. `None` (absent or nil) is the device pool: older vLLM had no
/// `medium` field, and SGLang omits it when unset.
const ENGINE: &[(&str, Tier)] = &[
    ("GPU", Tier::Device),
    ("CPU", Tier::CpuLocal),
    ("CPU_PINNED", Tier::CpuLocal),
    ("DISK", Tier::Disk),
    ("STORAGE", Tier::Disk),
    ("EXTERNAL", Tier::Disk),
];

/// Mooncake store media: its CPU pool is shared by every instance of the context.
const STORE: &[(&str, Tier)] = &[("cpu", Tier::CpuShare), ("disk", Tier::Disk)];

fn lookup(table: &[(&str, Tier)], medium: &str) -> Option<Tier> {
    table
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case(medium))
        .map(|&(_, tier)| tier)
}

/// The tier of an engine event's medium, `None` when the name is unknown.
pub fn engine_tier(medium: Option<&str>) -> Option<Tier> {
    match medium {
        None => Some(Tier::Device),
        Some(name) => lookup(ENGINE, name),
    }
}

/// The tier of a Mooncake store event's medium, `None` when absent or unknown.
pub fn store_tier(medium: Option<&str>) -> Option<Tier> {
    medium.and_then(|name| lookup(STORE, name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_media_map_case_insensitively() {
        assert_eq!(engine_tier(None), Some(Tier::Device));
        assert_eq!(engine_tier(Some("GPU")), Some(Tier::Device));
        assert_eq!(engine_tier(Some("gpu")), Some(Tier::Device));
        assert_eq!(engine_tier(Some("CPU")), Some(Tier::CpuLocal));
        assert_eq!(engine_tier(Some("cpu")), Some(Tier::CpuLocal));
        assert_eq!(engine_tier(Some("CPU_PINNED")), Some(Tier::CpuLocal));
        assert_eq!(engine_tier(Some("DISK")), Some(Tier::Disk));
        assert_eq!(engine_tier(Some("Storage")), Some(Tier::Disk));
        assert_eq!(engine_tier(Some("EXTERNAL")), Some(Tier::Disk));
        assert_eq!(engine_tier(Some("")), None);
        assert_eq!(engine_tier(Some("NVME")), None);
    }

    #[test]
    fn store_media_are_shared_tiers() {
        assert_eq!(store_tier(Some("cpu")), Some(Tier::CpuShare));
        assert_eq!(store_tier(Some("CPU")), Some(Tier::CpuShare));
        assert_eq!(store_tier(Some("Disk")), Some(Tier::Disk));
        assert_eq!(store_tier(Some("gpu")), None);
        assert_eq!(store_tier(None), None);
    }
}
