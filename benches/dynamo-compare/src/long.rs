//! One 1,000,000-token prompt (62,500 blocks) stored by one holder, queried from its tokens
//! (keys + walk) and by precomputed keys (the walk alone), in a fresh index of every side.

use std::time::{Duration, Instant};

use crate::indexers::{DynamoIndex, Kind};
use crate::latency::timed;
use crate::measure::percentiles;
use crate::workload::{self, BLOCK_SIZE, Event, PublisherBatch};
use crate::{SEED, dynamo, ours};

pub const LONG_TOKENS: usize = 1_000_000;
const LONG_RUNS: usize = 10;

/// p50 seconds of ours and of each Dynamo indexer (in [`Kind::ALL`] order).
pub struct LongQuery {
    pub from_tokens: (f64, [f64; 3]),
    pub by_keys: (f64, [f64; 3]),
}

/// The 1M-token prompt and the one publisher message of 16-block store events that stores it.
pub fn long_prompt() -> (Vec<u32>, PublisherBatch) {
    let mut rng = workload::Rng::new(SEED ^ 0x1_000_000);
    let tokens = rng.tokens(LONG_TOKENS);
    let n = LONG_TOKENS / BLOCK_SIZE;
    let batch = PublisherBatch {
        holder: 0,
        events: (0..n)
            .step_by(16)
            .map(|s| Event::Store {
                prompt: 0,
                start: s as u32,
                end: (s + 16).min(n) as u32,
            })
            .collect(),
    };
    (tokens, batch)
}

/// p50 of (from tokens, by keys) over [`LONG_RUNS`] runs.
fn p50s(mut s: [Vec<Duration>; 2]) -> (f64, f64) {
    let [a, b] = s.each_mut().map(|v| percentiles(v).0.as_secs_f64());
    (a, b)
}

pub fn long_query() -> Result<LongQuery, String> {
    let (tokens, batch) = long_prompt();
    let n = LONG_TOKENS / BLOCK_SIZE;

    let mut ours = ours::Ours::new(1);
    let keys = [ours.prompt(&tokens)];
    ours.apply(&ours.batch(&batch, &keys));
    let mut ours_keys = ours.query_keys(&tokens);
    let mut s: [Vec<Duration>; 2] = Default::default();
    for _ in 0..LONG_RUNS {
        let t = Instant::now();
        let hits = ours.query_tokens(&tokens);
        s[0].push(t.elapsed());
        let got = ours::device_tokens(&hits, 0);
        if got != LONG_TOKENS as u64 {
            return Err(format!("1M-token query: ours matched {got} tokens"));
        }
        s[1].push(timed(|| ours.query(&mut ours_keys)));
    }
    let (ours_tokens, ours_by_keys) = p50s(s);
    drop(ours);

    let mut from_tokens = [0.0; 3];
    let mut by_keys = [0.0; 3];
    let dyn_keys = dynamo::local_hashes(&tokens);
    for (i, kind) in Kind::ALL.into_iter().enumerate() {
        let index = DynamoIndex::new(kind);
        let keys = [dynamo::prompt(&tokens)];
        for ev in dynamo::EventBuilder::new(1).events(&batch, &keys) {
            index.send(ev);
        }
        index.flush();
        let mut s: [Vec<Duration>; 2] = Default::default();
        for _ in 0..LONG_RUNS {
            let t = Instant::now();
            let scores = index.query_tokens(&tokens);
            s[0].push(t.elapsed());
            let got = dynamo::overlap(&scores, 1)[0] as usize;
            if got != n {
                return Err(format!(
                    "1M-token query: {} matched {got} of {n} blocks",
                    kind.name()
                ));
            }
            s[1].push(timed(|| index.find_matches(&dyn_keys)));
        }
        (from_tokens[i], by_keys[i]) = p50s(s);
    }
    Ok(LongQuery {
        from_tokens: (ours_tokens, from_tokens),
        by_keys: (ours_by_keys, by_keys),
    })
}
