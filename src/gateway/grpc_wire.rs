//! Protobuf codecs of the gRPC query path, written by hand so that the server neither builds a
//! message tree per answer nor decodes a prompt one varint at a time through `bytes`' layers.
//! The bytes are the contract's (`proto/conductor.proto`); only the Rust types differ.
//!
//! - [`QueryReply`] encodes a `QueryResponse` straight from the walk's answer ([`AnswerView`]:
//!   the plan's instance ids and ranks beside the walk's counts), while the walk still lends it.
//!   The generated message holds a `HashMap<String, InstanceHits>` with two more maps per
//!   instance: about 200 allocations and SipHash runs per answer of 32 instances x 2 ranks, all
//!   freed right after encoding, and prost measures every nested message once per enclosing
//!   level. Here nothing is built per row: each row is measured once and written in one pass
//!   into the reply's one buffer. Fields follow prost's rules exactly: in tag
//!   order, default scalars omitted, a map entry's default key or value omitted; entries in the
//!   index's order (instances sorted, ranks ascending), which is as valid as a `HashMap`'s.
//! - [`QueryRequestIn`] and [`QueryByHashRequestIn`] decode the generated requests, except that
//!   a packed `token_ids` / `block_hashes` field lying in one contiguous chunk is read straight
//!   from the slice. Anything else (a field split over chunks, an unpacked encoding, a
//!   malformed varint) goes to prost's own decoder, so results and errors are prost's.

use prost::Message;
use prost::bytes::{Buf, BufMut};
use prost::encoding::{DecodeContext, WireType, int32, message, skip_field};

use crate::error::{Code, OpError};
use crate::gateway::answer_status::InstanceAnswerStatus;
use crate::gateway::engines_api::LoadReport;
use crate::gateway::pb;
use crate::index::{AnswerView, FlatAnswer, QueryHits};

/// `QueryResponse` field tags (`hits`, tag 3, is written by `grpc_answer`).
const RET: u32 = 1;
const ERROR: u32 = 2;
/// `QueryRequest.token_ids` and `QueryByHashRequest.block_hashes`.
const TOKEN_IDS: u32 = 5;
const BLOCK_HASHES: u32 = 5;

/// A `QueryResponse` encoded from the operation's result. Encode-only: the server never
/// decodes its own answers (decoding skips every field).
#[derive(Debug, Default)]
pub struct QueryReply {
    ret: i32,
    error: Option<pb::ErrorDetail>,
    /// The `hits` entries, already encoded from the walk's answer: one buffer per reply, written
    /// while the answer is borrowed from the walk, then copied once into the frame.
    hits: Vec<u8>,
}

impl QueryReply {
    /// The reply of a query's answer, encoded straight from the walk (see [`AnswerView`]).
    pub fn answer(answer: AnswerView<'_>) -> QueryReply {
        let mut hits = Vec::with_capacity(answer.len() * 48 + answer.rank_total() * 40);
        super::grpc_answer::encode_hits(answer, &mut hits);
        QueryReply {
            ret: Code::Ok.value(),
            error: None,
            hits,
        }
    }

    /// The same reply with the `loads` entries of `loads` after the hits.
    pub fn with_loads(mut self, loads: &[(String, LoadReport)]) -> QueryReply {
        let loads = loads
            .iter()
            .map(|(id, report)| {
                let ranks = (report.load.ranks.iter())
                    .map(|(rank, l)| {
                        let load = pb::RankLoad {
                            num_running_reqs: l.running as i64,
                            num_waiting_reqs: l.waiting as i64,
                            token_usage: l.token_usage,
                        };
                        (rank.to_string(), load)
                    })
                    .collect();
                let load = pb::InstanceLoad {
                    age_ms: report.age_ms as i64,
                    server_load: report.load.server_load.map(|n| n as i64),
                    ranks,
                };
                (id.clone(), load)
            })
            .collect();
        // Only `loads` is set, so only its entries are encoded (tag 4, after the hits' tag 3).
        let only_loads = pb::QueryResponse {
            loads,
            ..Default::default()
        };
        only_loads.encode_raw(&mut self.hits);
        self
    }

    /// The same reply with the `status` entries of `statuses` after the hits and loads (tag 5:
    /// prost's field order).
    pub fn with_status(
        mut self,
        statuses: &std::collections::BTreeMap<String, InstanceAnswerStatus>,
    ) -> QueryReply {
        let status = statuses
            .iter()
            .map(|(id, s)| {
                let ranks = (s.ranks.iter())
                    .map(|r| {
                        let groups = (r.groups.iter())
                            .map(|g| pb::CacheGroup {
                                group: g.idx,
                                kind: g.kind.family().to_owned(),
                                sliding_window: g.kind.window(),
                            })
                            .collect();
                        let rank = pb::RankStatus {
                            status: r.certainty.as_str().to_owned(),
                            reason: r.certainty.reason().to_owned(),
                            state: r.state.unwrap_or_default().to_owned(),
                            lag_ms: r.lag_ms.map(|ms| ms as i64),
                            groups,
                        };
                        (r.dp_rank.to_string(), rank)
                    })
                    .collect();
                let instance = pb::InstanceStatus {
                    status: s.certainty.as_str().to_owned(),
                    reason: s.certainty.reason().to_owned(),
                    ranks,
                };
                (id.clone(), instance)
            })
            .collect();
        let only_status = pb::QueryResponse {
            status,
            ..Default::default()
        };
        only_status.encode_raw(&mut self.hits);
        self
    }

    /// The reply of a failed query.
    pub fn error(e: &OpError) -> QueryReply {
        QueryReply {
            ret: e.code.value(),
            error: Some(error_detail(e)),
            hits: Vec::new(),
        }
    }

    /// The reply of an owned answer or an error.
    pub fn new(result: Result<QueryHits, OpError>) -> QueryReply {
        match result {
            Ok(hits) => QueryReply::answer(FlatAnswer::from_hits(&hits).view()),
            Err(e) => QueryReply::error(&e),
        }
    }

    /// The reply of [`crate::gateway::ops::Ops::query_with`]'s result.
    pub fn of(result: Result<QueryReply, OpError>) -> QueryReply {
        result.unwrap_or_else(|e| QueryReply::error(&e))
    }
}

impl Message for QueryReply {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        if self.ret != 0 {
            int32::encode(RET, &self.ret, buf);
        }
        if let Some(error) = &self.error {
            message::encode(ERROR, error, buf);
        }
        buf.put_slice(&self.hits);
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        skip_field(wire_type, tag, buf, ctx)
    }

    fn encoded_len(&self) -> usize {
        let ret = if self.ret != 0 {
            int32::encoded_len(RET, &self.ret)
        } else {
            0
        };
        let error = self
            .error
            .as_ref()
            .map_or(0, |e| message::encoded_len(ERROR, e));
        ret + error + self.hits.len()
    }

    fn clear(&mut self) {
        *self = QueryReply::default();
    }
}

/// The varint at the start of `bytes` and its length, or `None` if it is truncated or longer
/// than protobuf allows (ten bytes, the last at most 1), which prost then reports itself.
/// Token ids below 2^21 take at most three bytes: those lengths are decoded without a loop.
#[inline]
fn varint(bytes: &[u8]) -> Option<(u64, usize)> {
    let low = |b: u8| u64::from(b & 0x7f);
    match *bytes {
        [b0, ..] if b0 < 0x80 => Some((u64::from(b0), 1)),
        [b0, b1, ..] if b1 < 0x80 => Some((low(b0) | u64::from(b1) << 7, 2)),
        [b0, b1, b2, ..] if b2 < 0x80 => Some((low(b0) | low(b1) << 7 | u64::from(b2) << 14, 3)),
        _ => long_varint(bytes),
    }
}

#[cold]
fn long_varint(bytes: &[u8]) -> Option<(u64, usize)> {
    let mut value = 0u64;
    for (i, b) in bytes.iter().take(10).enumerate() {
        if i == 9 && *b > 1 {
            return None;
        }
        value |= u64::from(b & 0x7f) << (7 * i);
        if *b < 0x80 {
            return Some((value, i + 1));
        }
    }
    None
}

/// Append a packed repeated varint field (its length prefix is next in `buf`) to `out`, if the
/// whole field lies in `buf`'s current chunk and is well-formed; otherwise leave `buf` and
/// `out` as they were and return false.
fn merge_packed<T>(buf: &mut impl Buf, out: &mut Vec<T>, convert: fn(u64) -> T) -> bool {
    let chunk = buf.chunk();
    let Some((len, header)) = varint(chunk) else {
        return false;
    };
    let body = usize::try_from(len)
        .ok()
        .and_then(|len| chunk.get(header..header.checked_add(len)?));
    let Some(mut rest) = body else {
        return false;
    };
    let consumed = header + rest.len();
    // Every varint ends in exactly one byte below 0x80.
    out.reserve(rest.iter().filter(|b| **b < 0x80).count());
    let start = out.len();
    while !rest.is_empty() {
        let Some((v, n)) = varint(rest) else {
            out.truncate(start);
            return false;
        };
        out.push(convert(v));
        rest = &rest[n..];
    }
    buf.advance(consumed);
    true
}

/// Truncation as prost decodes an `int32`.
fn as_int32(v: u64) -> i32 {
    v as i32
}

fn as_uint64(v: u64) -> u64 {
    v
}

/// A request message decoded by prost, except for one packed repeated field that is read
/// straight from the buffer when it arrives in one piece (see `merge_packed`).
macro_rules! packed_fast_path {
    ($(#[$doc:meta])* $name:ident($inner:ty), $tag:expr, $field:ident, $convert:expr) => {
        $(#[$doc])*
        #[derive(Debug, Default, Clone, PartialEq)]
        pub struct $name(pub $inner);

        impl Message for $name {
            fn encode_raw(&self, buf: &mut impl BufMut) {
                self.0.encode_raw(buf)
            }

            fn merge_field(
                &mut self,
                tag: u32,
                wire_type: WireType,
                buf: &mut impl Buf,
                ctx: DecodeContext,
            ) -> Result<(), prost::DecodeError> {
                if tag == $tag
                    && wire_type == WireType::LengthDelimited
                    && merge_packed(buf, &mut self.0.$field, $convert)
                {
                    return Ok(());
                }
                self.0.merge_field(tag, wire_type, buf, ctx)
            }

            fn encoded_len(&self) -> usize {
                self.0.encoded_len()
            }

            fn clear(&mut self) {
                self.0.clear()
            }
        }
    };
}

packed_fast_path!(
    /// A `QueryRequest` decoded by prost, with the packed `token_ids` fast path.
    QueryRequestIn(pb::QueryRequest),
    TOKEN_IDS,
    token_ids,
    as_int32
);

packed_fast_path!(
    /// A `QueryByHashRequest` decoded by prost, with the packed `block_hashes` fast path.
    QueryByHashRequestIn(pb::QueryByHashRequest),
    BLOCK_HASHES,
    block_hashes,
    as_uint64
);

/// The gRPC error detail of an operation error (every answer's `error` field).
pub(super) fn error_detail(e: &OpError) -> pb::ErrorDetail {
    pb::ErrorDetail {
        field: e.field.clone().unwrap_or_default(),
        reason: e.reason.to_owned(),
        message: e.message.clone(),
    }
}

#[cfg(test)]
#[path = "grpc_wire_tests.rs"]
mod tests;
