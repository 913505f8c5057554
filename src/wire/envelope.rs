//! The batch envelope shared by every publisher, and the per-event error plumbing.
//!
//! An envelope is `[ts, events]`, `[ts, events, dp_rank]` or (engines only) the map
//! `{ts, events, data_parallel_rank | attn_dp_rank}`. Events are decoded in place as the envelope is
//! read, so a payload is walked once. A failing event is rewound and skipped whole: its error is
//! recorded and its siblings still decode, in order.

use std::fmt;

use super::EnvelopeError;
use super::msgpack::{Fail, Kind, Read, Reader};
use crate::events::{DecodedBatch, IgnoreReason, KvEvent};

/// What one well-formed event turned into.
pub(crate) enum Outcome {
    Event(KvEvent),
    Ignored(IgnoreReason),
}

/// Why one event was rejected. Rendered as `event <index>: <field>: <problem>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EventError {
    pub field: &'static str,
    pub problem: Problem,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Problem {
    Missing,
    Duplicate,
    WrongType {
        expected: &'static str,
        got: &'static str,
    },
    /// A recognized key that this event type must not carry (stored-only keys on a removal...).
    NotAllowed {
        on: &'static str,
    },
    Invalid(&'static str),
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::Missing => f.write_str("missing required key"),
            Problem::Duplicate => f.write_str("duplicate key"),
            Problem::WrongType { expected, got } => write!(f, "expected {expected}, got {got}"),
            Problem::NotAllowed { on } => write!(f, "not allowed on {on}"),
            Problem::Invalid(why) => f.write_str(why),
        }
    }
}

pub(crate) enum EventFail {
    /// The bytes stop being msgpack: the whole payload is unusable.
    Malformed {
        offset: usize,
    },
    Invalid(EventError),
}

pub(crate) type EventResult<T> = Result<T, EventFail>;

pub(crate) fn invalid<T>(field: &'static str, problem: Problem) -> EventResult<T> {
    Err(EventFail::Invalid(EventError { field, problem }))
}

/// Attach the field name (and the expected type) to a typed read.
pub(crate) fn typed<T>(
    read: Read<T>,
    field: &'static str,
    expected: &'static str,
) -> EventResult<T> {
    read.map_err(|fail| match fail {
        Fail::Malformed { offset } => EventFail::Malformed { offset },
        Fail::Type { got } => EventFail::Invalid(EventError {
            field,
            problem: Problem::WrongType { expected, got },
        }),
    })
}

/// Reads of structure the caller already checked (a peeked kind) can only fail as malformed.
pub(crate) fn structural<T>(read: Read<T>) -> EventResult<T> {
    read.map_err(|fail| match fail {
        Fail::Malformed { offset } => EventFail::Malformed { offset },
        Fail::Type { got } => EventFail::Invalid(EventError {
            field: "<event>",
            problem: Problem::WrongType {
                expected: "msgpack value",
                got,
            },
        }),
    })
}

/// Which batch shapes a publisher may send.
pub(crate) struct Rules {
    /// Engines: newer vLLM snapshots encode the batch as a map.
    pub map_batch: bool,
}

const RANK_KEYS: [&str; 2] = ["data_parallel_rank", "attn_dp_rank"];

fn env_malformed(fail: Fail) -> EnvelopeError {
    match fail {
        Fail::Malformed { offset } => EnvelopeError::Malformed { offset },
        // Only reached on structure reads after a peek, which cannot mismatch.
        Fail::Type { got } => EnvelopeError::RootType { got },
    }
}

/// Decode a whole payload with `event` decoding each event.
pub(crate) fn decode_batch<'a, F>(
    payload: &'a [u8],
    rules: &Rules,
    mut event: F,
) -> Result<DecodedBatch, EnvelopeError>
where
    F: FnMut(&mut Reader<'a>) -> EventResult<Outcome>,
{
    if payload.is_empty() {
        return Err(EnvelopeError::Empty);
    }
    let mut r = Reader::new(payload);
    let mut batch = DecodedBatch::default();
    match r.peek().map_err(env_malformed)? {
        Kind::Array => {
            let len = r.array_len().map_err(env_malformed)?;
            if !(2..=3).contains(&len) {
                return Err(EnvelopeError::BatchLength { len });
            }
            batch.ts = read_ts(&mut r)?;
            read_events(&mut r, &mut batch, &mut event)?;
            if len == 3 {
                batch.dp_rank = read_rank(&mut r)?;
            }
        }
        Kind::Map if rules.map_batch => {
            let len = r.map_len().map_err(env_malformed)?;
            let (mut ts, mut events, mut rank) = (false, false, false);
            for _ in 0..len {
                let key = match r.str() {
                    Ok(key) => key,
                    Err(Fail::Type { .. }) => return Err(EnvelopeError::NonStringKey),
                    Err(fail) => return Err(env_malformed(fail)),
                };
                let (seen, name): (&mut bool, &'static str) = match key {
                    "ts" => (&mut ts, "ts"),
                    "events" => (&mut events, "events"),
                    k if RANK_KEYS.contains(&k) => (&mut rank, "dp_rank"),
                    _ => {
                        r.skip().map_err(env_malformed)?;
                        continue;
                    }
                };
                if std::mem::replace(seen, true) {
                    return Err(EnvelopeError::DuplicateKey { key: name });
                }
                match name {
                    "ts" => batch.ts = read_ts(&mut r)?,
                    "events" => read_events(&mut r, &mut batch, &mut event)?,
                    _ => batch.dp_rank = read_rank(&mut r)?,
                }
            }
            if !ts {
                return Err(EnvelopeError::MissingKey { key: "ts" });
            }
            if !events {
                return Err(EnvelopeError::MissingKey { key: "events" });
            }
        }
        other => return Err(EnvelopeError::RootType { got: other.name() }),
    }
    if r.remaining() > 0 {
        return Err(EnvelopeError::TrailingBytes {
            count: r.remaining(),
        });
    }
    Ok(batch)
}

fn read_ts(r: &mut Reader<'_>) -> Result<f64, EnvelopeError> {
    let ts = match r.peek().map_err(env_malformed)? {
        Kind::Float => r.float().map_err(env_malformed)?,
        // msgspec always writes a float, but an integral ts (Mooncake's milliseconds) is as good.
        Kind::Int => r.int().map_err(env_malformed)? as f64,
        other => {
            return Err(EnvelopeError::Timestamp {
                reason: other.name(),
            });
        }
    };
    if ts.is_finite() {
        Ok(ts)
    } else {
        Err(EnvelopeError::Timestamp {
            reason: "not finite",
        })
    }
}

fn read_rank(r: &mut Reader<'_>) -> Result<Option<u32>, EnvelopeError> {
    match r.peek().map_err(env_malformed)? {
        Kind::Nil => {
            r.skip().map_err(env_malformed)?;
            Ok(None)
        }
        Kind::Int => {
            let v = r.int().map_err(env_malformed)?;
            u32::try_from(v)
                .map(Some)
                .map_err(|_| EnvelopeError::DpRank {
                    reason: "out of range",
                })
        }
        other => Err(EnvelopeError::DpRank {
            reason: other.name(),
        }),
    }
}

fn read_events<'a, F>(
    r: &mut Reader<'a>,
    batch: &mut DecodedBatch,
    event: &mut F,
) -> Result<(), EnvelopeError>
where
    F: FnMut(&mut Reader<'a>) -> EventResult<Outcome>,
{
    let n = match r.peek().map_err(env_malformed)? {
        Kind::Array => r.array_len().map_err(env_malformed)?,
        other => return Err(EnvelopeError::EventsType { got: other.name() }),
    };
    batch.events.reserve(r.capacity_for(n));
    for index in 0..n {
        let start = r.pos();
        match event(r) {
            Ok(Outcome::Event(ev)) => batch.events.push(ev),
            Ok(Outcome::Ignored(reason)) => batch.ignored.push(reason),
            Err(EventFail::Malformed { offset }) => {
                return Err(EnvelopeError::Malformed { offset });
            }
            Err(EventFail::Invalid(err)) => {
                // The decoder may have stopped anywhere inside the event: skip it from its start.
                r.rewind(start);
                r.skip().map_err(env_malformed)?;
                batch
                    .invalid
                    .push(format!("event {index}: {}: {}", err.field, err.problem));
            }
        }
    }
    Ok(())
}

/// Read a map key that must be a UTF-8 string.
pub(crate) fn map_key<'a>(r: &mut Reader<'a>) -> EventResult<&'a str> {
    typed(r.str(), "<key>", "str key")
}
