//! One payload through the service's ingest rules, without any I/O: decode it for the
//! registration's publisher type and projection, reject an engine batch stamped with another DP
//! rank, and route what is left to its contexts. The subscription actor applies the result to
//! the context actors; `check` applies it to in-process indexes.

use crate::events::{DecodedBatch, IgnoreReason};
use crate::model::PublisherConfig;
use crate::wire::{self, EnvelopeError};

use super::route::{Routed, Router};

/// Why a payload gives the contexts nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rejected {
    /// Not a batch of the registered publisher type.
    Undecodable(EnvelopeError),
    /// An engine batch from another DP rank than registered (the rank it names): rejected whole.
    OtherRank(Option<u32>),
}

/// What a payload gives the contexts.
#[derive(Debug)]
pub struct RoutedBatch {
    /// The batch timestamp (seconds for engines, milliseconds for the Mooncake store).
    pub ts: f64,
    /// Index ops per context.
    pub routed: Routed,
    /// Every event skipped, by decoding and then by routing.
    pub ignored: Vec<IgnoreReason>,
}

/// Decode `payload`, apply the DP-rank rule, show the decoded batch to `inspect` (before routing
/// consumes it), and route it.
pub fn decode_and_route(
    config: &PublisherConfig,
    router: &mut Router,
    payload: &[u8],
    inspect: impl FnOnce(&DecodedBatch),
) -> Result<RoutedBatch, Rejected> {
    let projection = config.hash_profile.index_projection();
    let mut batch =
        wire::decode(config.publisher_type, payload, projection).map_err(Rejected::Undecodable)?;
    if config.publisher_type.is_engine() && batch.dp_rank.is_some_and(|r| r != config.dp_rank) {
        return Err(Rejected::OtherRank(batch.dp_rank));
    }
    inspect(&batch);
    let mut ignored = std::mem::take(&mut batch.ignored);
    let ts = batch.ts;
    let routed = router.route(batch, &mut ignored);
    Ok(RoutedBatch {
        ts,
        routed,
        ignored,
    })
}

#[cfg(test)]
pub(super) mod tests {
    use rmpv::Value as M;

    use super::*;

    pub(in crate::subscription) fn config() -> PublisherConfig {
        PublisherConfig {
            block_size: 2,
            dp_rank: 1,
            ..PublisherConfig::test_vllm("i", "tcp://127.0.0.1:1")
        }
    }

    pub(in crate::subscription) fn stored(hash: u64, block_size: i64, lora: Option<&str>) -> M {
        let s = |v: &str| M::from(v);
        M::Map(vec![
            (s("type"), s("BlockStored")),
            (s("block_hashes"), M::Array(vec![M::from(hash)])),
            (s("parent_block_hash"), M::Nil),
            (s("token_ids"), M::Array(vec![M::from(1), M::from(2)])),
            (s("block_size"), M::from(block_size)),
            (s("lora_id"), M::Nil),
            (s("medium"), s("GPU")),
            (s("lora_name"), lora.map_or(M::Nil, M::from)),
            (s("extra_keys"), M::Array(vec![M::Nil])),
            (s("group_idx"), M::from(0)),
            (s("kv_cache_spec_kind"), s("full_attention")),
        ])
    }

    pub(in crate::subscription) fn batch(events: Vec<M>, rank: u32) -> Vec<u8> {
        let mut out = Vec::new();
        let v = M::Array(vec![M::F64(1.5e9), M::Array(events), M::from(rank)]);
        rmpv::encode::write_value(&mut out, &v).unwrap();
        out
    }

    #[test]
    fn a_batch_is_decoded_rank_checked_inspected_and_routed() {
        let config = config();
        let mut router = Router::new(&config);
        let payload = batch(
            vec![
                stored(7, 2, None),
                stored(8, 4, None),
                stored(9, 2, Some("adapter")),
                M::from("not an event"),
            ],
            1,
        );
        let mut seen = None;
        let out = decode_and_route(&config, &mut router, &payload, |b| {
            seen = Some((b.events.len(), b.invalid.len()));
        })
        .unwrap();
        assert_eq!(seen, Some((3, 1)), "inspected before routing");
        assert_eq!(out.ts, 1.5e9);
        let contexts: Vec<&str> = out
            .routed
            .iter()
            .map(|(c, _)| c.lora_name.as_str())
            .collect();
        assert_eq!(contexts, ["", "adapter"]);
        assert_eq!(out.ignored, [IgnoreReason::BlockSizeMismatch]);
    }

    #[test]
    fn a_foreign_payload_or_another_rank_gives_nothing_and_is_not_inspected() {
        let config = config();
        let mut router = Router::new(&config);
        let mut inspected = 0;
        let r = decode_and_route(&config, &mut router, b"\xc1", |_| inspected += 1);
        assert!(matches!(r, Err(Rejected::Undecodable(_))), "{r:?}");
        let other = batch(vec![stored(7, 2, None)], 3);
        let r = decode_and_route(&config, &mut router, &other, |_| inspected += 1);
        assert_eq!(r.unwrap_err(), Rejected::OtherRank(Some(3)));
        assert_eq!(inspected, 0);
    }
}
