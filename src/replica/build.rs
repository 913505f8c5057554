//! Building the contexts straight from a snapshot's records as they arrive, so that a pull
//! need not read back from the store what it has just written (recovery's scan and decode).
//!
//! A well-formed snapshot sends each context's records in the store's own order: contexts by
//! id, and within one its header, holders, attachments, watermarks, pairs and aliases, each
//! column family by key. Fed in that order, [`StreamBuild`] makes exactly the contexts recovery
//! would make from the store the records were written to: the same decoding, the same
//! [`Restorer`], the same [`settle`]. Anything else (a record out of that order, a repeated
//! key, a record recovery would ignore or refuse) stops the build with the reason, and the
//! pull falls back to recovering from the store, which then decides as after a restart.

use std::collections::{BTreeMap, HashMap};

use crate::durability::codec;
use crate::durability::recovery::{Recovered, holder_id, settle};
use crate::index::{ContextIndex, Restorer, Watermark};
use crate::model::{PublisherConfig, SubscriptionKey};
use crate::storage::{Cf, KvOp};

/// The position of a column family within one context's records, in the order a cut sends them
/// and recovery reads them. Registrations and the schema version belong to no context.
fn rank(cf: Cf) -> Option<u8> {
    Some(match cf {
        Cf::Contexts => 0,
        Cf::Holders => 1,
        Cf::Attachments => 2,
        Cf::Watermarks => 3,
        Cf::Pairs => 4,
        Cf::Aliases => 5,
        Cf::Registrations | Cf::Meta | Cf::Sources => return None,
    })
}

/// The context whose records are arriving.
struct Current {
    ctx: [u8; 8],
    restorer: Restorer,
    aliases: Vec<(u64, u64)>,
    /// The last record's column family rank and key: each record must come after it.
    last_rank: u8,
    last_key: Vec<u8>,
}

/// Contexts rebuilt from a stream of records (see the module doc).
#[derive(Default)]
pub struct StreamBuild {
    current: Option<Current>,
    contexts: Vec<ContextIndex>,
    pairs: u64,
    /// The registrations fed so far, decoded, by service key.
    registrations: BTreeMap<String, (PublisherConfig, u64)>,
}

impl StreamBuild {
    /// Feed the records of one chunk. Registrations (after every context in a cut) are decoded
    /// as they arrive, so the stream's raw records are never held. An error says why the stream
    /// cannot be built from.
    pub fn feed(&mut self, ops: &[KvOp]) -> Result<(), String> {
        for op in ops {
            let KvOp::Put { cf, key, value } = op else {
                return Err("a snapshot record that is not a put".into());
            };
            if *cf == Cf::Registrations {
                self.registration(key, value)?;
            } else {
                self.record(*cf, key, value)?;
            }
        }
        Ok(())
    }

    fn registration(&mut self, key: &[u8], value: &[u8]) -> Result<(), String> {
        let config = codec::decode_registration(value).map_err(|e| e.to_string())?;
        let incarnation = codec::decode_incarnation(value).map_err(|e| e.to_string())?;
        let name = String::from_utf8_lossy(key).into_owned();
        if self
            .registrations
            .insert(name, (config, incarnation))
            .is_some()
        {
            return Err("a registration record repeated".into());
        }
        Ok(())
    }

    fn record(&mut self, cf: Cf, key: &[u8], value: &[u8]) -> Result<(), String> {
        let rank = rank(cf).ok_or_else(|| format!("a {cf:?} record among the contexts'"))?;
        if cf == Cf::Contexts {
            return self.begin_context(key, value);
        }
        let current = self
            .current
            .as_mut()
            .ok_or_else(|| format!("a {cf:?} record before any context"))?;
        if key.get(..8) != Some(&current.ctx[..]) {
            return Err(format!(
                "a {cf:?} record of another context than its header's"
            ));
        }
        if (rank, key) <= (current.last_rank, &current.last_key[..]) {
            return Err(format!("a {cf:?} record out of the store's order"));
        }
        current.last_rank = rank;
        current.last_key.clear();
        current.last_key.extend_from_slice(key);
        let restorer = &mut current.restorer;
        let corrupt = |e: crate::storage::StorageError| e.to_string();
        match cf {
            Cf::Holders => {
                let record = codec::decode_holder(holder_id(key), value).map_err(corrupt)?;
                restorer.holder(&record)?;
            }
            Cf::Attachments => {
                let a = codec::decode_attachment(value).map_err(corrupt)?;
                restorer.attach(&a.source, &a.instance_id, a.dp_rank);
            }
            Cf::Watermarks => {
                let source = codec::decode_watermark_source(key).map_err(corrupt)?;
                let mark = codec::decode_watermark(value).map_err(corrupt)?;
                restorer.watermark(source, mark);
            }
            Cf::Pairs => {
                let (holder, block) = codec::decode_pair_key(key).map_err(corrupt)?;
                let (bits, repeats) = codec::decode_pair_value(value).map_err(corrupt)?;
                self.pairs += u64::from(restorer.pair(holder, block, bits));
                for (bit, extra) in repeats {
                    restorer.repeat(holder, block, bit, extra);
                }
            }
            Cf::Aliases => {
                let alias = codec::decode_alias(key, value).map_err(corrupt)?;
                current.aliases.push(alias);
            }
            Cf::Contexts | Cf::Registrations | Cf::Meta | Cf::Sources => {}
        }
        Ok(())
    }

    fn begin_context(&mut self, key: &[u8], value: &[u8]) -> Result<(), String> {
        let ctx: [u8; 8] = key
            .try_into()
            .map_err(|_| "a context record whose key is not 8 bytes".to_owned())?;
        if self.current.as_ref().is_some_and(|c| ctx <= c.ctx) {
            return Err("a context record out of the store's order".into());
        }
        let (context, profile) = codec::decode_context(value).map_err(|e| e.to_string())?;
        self.end_context();
        self.current = Some(Current {
            ctx,
            restorer: Restorer::new(context, profile),
            aliases: Vec::new(),
            last_rank: 0,
            last_key: key.to_vec(),
        });
        Ok(())
    }

    fn end_context(&mut self) {
        if let Some(mut done) = self.current.take() {
            done.restorer.aliases(std::mem::take(&mut done.aliases));
            self.contexts.push(done.restorer.finish());
        }
    }

    /// The contexts and registrations fed, as recovery would load them from a store holding the
    /// same records. `sources`: the source records written with them.
    pub fn finish(
        mut self,
        sources: HashMap<SubscriptionKey, (u64, Watermark)>,
    ) -> Result<Recovered, String> {
        self.end_context();
        Ok(settle(
            self.registrations,
            self.contexts,
            sources,
            self.pairs,
        ))
    }
}
