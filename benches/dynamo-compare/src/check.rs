//! The check: every sampled query, asked every way of every side given, must give the same
//! matched blocks per holder. Its summary also carries, per query, the deepest match (to pick
//! the long walks) and a digest of the answer (to compare sides run in other processes).

use std::hash::{DefaultHasher, Hash, Hasher};

use crate::dynamo;
use crate::indexers::DynamoIndex;
use crate::ours::{self, Ours};
use crate::workload::{BLOCK_SIZE, QUERY_TOKENS, Workload};

pub struct Summary {
    /// Per query: the most blocks any holder matches.
    pub depths: Vec<u32>,
    /// Per query: a digest of the per-holder matched blocks.
    pub digests: Vec<u64>,
    pub any_hit: usize,
    pub partial: usize,
    /// Matched (block, holder) pairs over all queries.
    pub matched: u64,
    /// Mean size of the service's encoded answer, in bytes (0 without ours).
    pub reply_bytes: f64,
}

impl Summary {
    pub fn line(&self, sides: &str) -> String {
        format!(
            "check: {} queries, per-holder overlap identical in {sides} ({} with a hit, {} of \
             them partial; {} matched (block, holder) pairs in all)",
            self.depths.len(),
            self.any_hit,
            self.partial,
            self.matched
        )
    }
}

/// Asks every query every way; `Err` names the first differences.
pub fn check(
    w: &Workload,
    ours: Option<&Ours>,
    dynamo: &[&DynamoIndex],
) -> Result<Summary, String> {
    let holders = w.holders();
    let full = (QUERY_TOKENS / BLOCK_SIZE) as u32;
    let mut s = Summary {
        depths: Vec::with_capacity(w.queries.len()),
        digests: Vec::with_capacity(w.queries.len()),
        any_hit: 0,
        partial: 0,
        matched: 0,
        reply_bytes: 0.0,
    };
    let mut mismatches = 0usize;
    let mut reply_bytes = 0usize;
    for (q, tokens) in w.queries.iter().enumerate() {
        let mut answers: Vec<(String, Vec<u32>)> = Vec::new();
        if let Some(o) = ours {
            let bytes = o.service_query(tokens);
            reply_bytes += bytes.len();
            answers.push((
                "ours by keys".into(),
                ours::overlap(&o.query(&mut o.query_keys(tokens)), holders),
            ));
            answers.push((
                "ours from tokens".into(),
                ours::overlap(&o.query_tokens(tokens), holders),
            ));
            answers.push((
                "ours service call".into(),
                ours::overlap_encoded(&bytes, holders),
            ));
        }
        for d in dynamo {
            let name = d.kind.name();
            let keys = d.find_matches(&dynamo::local_hashes(tokens));
            answers.push((format!("{name} by keys"), dynamo::overlap(&keys, holders)));
            answers.push((
                format!("{name} from tokens"),
                dynamo::overlap(&d.query_tokens(tokens), holders),
            ));
        }
        let (_, reference) = &answers[0];
        let differ: Vec<String> = answers[1..]
            .iter()
            .filter_map(|(way, a)| {
                let h = (0..holders).find(|&h| a[h] != reference[h])?;
                Some(format!(
                    "holder {h}: {} {} vs {way} {}",
                    answers[0].0, reference[h], a[h]
                ))
            })
            .collect();
        if !differ.is_empty() {
            mismatches += 1;
            if mismatches <= 3 {
                eprintln!("query {q} differs: {}", differ.join("; "));
            }
        }
        let max = reference.iter().copied().max().unwrap_or(0);
        s.depths.push(max);
        let mut h = DefaultHasher::new();
        reference.hash(&mut h);
        s.digests.push(h.finish());
        s.any_hit += usize::from(max > 0);
        s.partial += usize::from(max > 0 && max < full);
        s.matched += reference.iter().map(|&x| u64::from(x)).sum::<u64>();
    }
    if mismatches > 0 {
        return Err(format!(
            "{mismatches} of {} queries answer differently",
            w.queries.len()
        ));
    }
    s.reply_bytes = reply_bytes as f64 / w.queries.len().max(1) as f64;
    Ok(s)
}
