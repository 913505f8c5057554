//! Publisher payload decoders: one msgpack payload (ZeroMQ frame 2) in, one [`DecodedBatch`] of
//! normalized events out. README.md beside this file shows the bytes of every accepted layout.
//!
//! Layout:
//! * `msgpack` — a zero-copy msgpack reader (no value tree, no allocation driven by declared
//!   lengths);
//! * `envelope` — the batch (`[ts, events(, dp_rank)]` or the map form) and per-event error
//!   isolation, shared by every publisher;
//! * `schema` — the engine event keys, allowed/required per event type, positional layouts;
//! * `vllm` — vLLM and SGLang engine events (map or positional), their `Raw*` wire types and the
//!   conversion to domain events;
//! * `mooncake` — Mooncake store object events;
//! * [`medium`] — the one medium → tier table.
//!
//! What the decoder decides and what it leaves to the caller: it validates and normalizes each
//! event (hash projection, medium → tier, cache group / spec filters) and reports the batch's DP
//! rank; the caller compares that rank with the registration and applies LoRA / block-size /
//! context rules, which need the registration.

mod envelope;
pub mod medium;
mod mooncake;
pub(crate) mod msgpack;
mod schema;
mod vllm;

#[cfg(test)]
mod tests;

use thiserror::Error;

use crate::events::DecodedBatch;
use crate::hashing::IndexProjection;
use crate::model::PublisherType;

/// Why a whole payload is unusable (nothing in it is applied). Errors of single events are not
/// here: they are reported in [`DecodedBatch::invalid`] and their siblings still apply.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum EnvelopeError {
    #[error("empty payload")]
    Empty,
    #[error("not msgpack (at byte {offset})")]
    Malformed { offset: usize },
    #[error("{count} trailing bytes after the batch")]
    TrailingBytes { count: usize },
    #[error("the batch must be an array (or, from an engine, a map), got {got}")]
    RootType { got: &'static str },
    #[error("the batch array must have 2 or 3 elements, got {len}")]
    BatchLength { len: u32 },
    #[error("a batch map key is not a string")]
    NonStringKey,
    #[error("duplicate batch key `{key}`")]
    DuplicateKey { key: &'static str },
    #[error("the batch has no `{key}`")]
    MissingKey { key: &'static str },
    #[error("bad batch timestamp: {reason}")]
    Timestamp { reason: &'static str },
    #[error("the batch events must be an array, got {got}")]
    EventsType { got: &'static str },
    #[error("bad batch dp rank: {reason}")]
    DpRank { reason: &'static str },
}

/// Decode one publisher payload.
///
/// `projection` is the registered hash profile's index projection; it reduces hashes sent as raw
/// digests (bin) and Mooncake connector digests to the 64-bit index key. Integer hashes are
/// already projected by the publisher and are kept as their 64-bit pattern. Never panics; memory
/// is bounded by the payload size.
pub fn decode(
    kind: PublisherType,
    payload: &[u8],
    projection: IndexProjection,
) -> Result<DecodedBatch, EnvelopeError> {
    match kind {
        PublisherType::Vllm => decode_engine(vllm::Engine::Vllm, payload, projection),
        PublisherType::Sglang => decode_engine(vllm::Engine::Sglang, payload, projection),
        PublisherType::Mooncake => {
            envelope::decode_batch(payload, &envelope::Rules { map_batch: false }, |r| {
                mooncake::decode_event(r, projection)
            })
        }
    }
}

fn decode_engine(
    engine: vllm::Engine,
    payload: &[u8],
    projection: IndexProjection,
) -> Result<DecodedBatch, EnvelopeError> {
    envelope::decode_batch(payload, &envelope::Rules { map_batch: true }, |r| {
        vllm::decode_event(r, engine, projection)
    })
}
