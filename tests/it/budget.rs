//! The memory budget against the real binary: a context past `max_context_blocks` evicts its
//! oldest chains deepest block first, answers a shorter true prefix of what the engine holds
//! (never a false hit), counts the evictions in `/services/status` and `/metrics`, says degraded
//! on `/health`, and after a SIGKILL and a restart on the same data directory obeys the cap again
//! with the same guarantee.

use std::collections::HashMap;

use serde_json::json;

use crate::support::deliver::{deliver, handshake};
use crate::support::engine::{self, vllm_cbor_profile};
use crate::support::fleet::{BS, MODEL, register};
use crate::support::player::Player;
use crate::support::query::grpc_query;
use crate::support::server::Server;
use crate::support::{WAIT, eventually, http};

const CAP: u64 = 20;
/// Blocks per conversation, stored in two events of half as many (the second names the first's
/// last block as its parent, as vLLM does for a continued prompt).
const BLOCKS: usize = 8;
const CONVERSATIONS: i32 = 6;

fn tokens(c: i32) -> Vec<i32> {
    (0..(BLOCKS as i32 * BS as i32))
        .map(|i| c * 1000 + i)
        .collect()
}

fn keys(c: i32) -> Vec<u64> {
    engine::block_keys(&vllm_cbor_profile(), &tokens(c), BS, "")
}

/// What the engine holds: announcements per block on device, rank 0.
#[derive(Default)]
struct Engine {
    held: HashMap<u64, u32>,
}

impl Engine {
    /// Store blocks `from..to` of conversation `c` (one event).
    fn store(&mut self, c: i32, from: usize, to: usize) -> Vec<u8> {
        let (k, t) = (keys(c), tokens(c));
        for key in &k[from..to] {
            *self.held.entry(*key).or_default() += 1;
        }
        let parent = from.checked_sub(1).map(|i| k[i]);
        let event = engine::vllm_stored(
            &k[from..to],
            parent,
            &t[from * BS as usize..to * BS as usize],
            BS,
            "GPU",
            None,
        );
        engine::batch(vec![event], 0)
    }

    /// Remove one announcement of each block of conversation `c`.
    fn remove_all(&mut self, c: i32) -> Vec<u8> {
        let k = keys(c);
        for key in &k {
            if let Some(n) = self.held.get_mut(key) {
                *n -= 1;
                if *n == 0 {
                    self.held.remove(key);
                }
            }
        }
        engine::batch(vec![engine::vllm_removed(&k, "GPU")], 0)
    }

    /// The blocks of conversation `c` the engine holds from its first on.
    fn prefix(&self, c: i32) -> i64 {
        keys(c)
            .iter()
            .take_while(|k| self.held.contains_key(k))
            .count() as i64
    }
}

/// Device hits of instance `e` for each conversation, in blocks.
async fn answers(server: &Server) -> Vec<i64> {
    let mut out = Vec::new();
    for c in 0..CONVERSATIONS {
        let r = grpc_query(server, MODEL, tokens(c), BS as i64).await;
        out.push(r.hits.get("e").map_or(0, |h| h.device) / BS as i64);
    }
    out
}

/// Every answer is a prefix of what the engine holds: never longer than the engine's own.
fn assert_true_prefixes(answers: &[i64], engine: &Engine, when: &str) {
    for (c, &a) in answers.iter().enumerate() {
        let truth = engine.prefix(c as i32);
        assert!(
            a <= truth,
            "{when}: conversation {c} answers {a} blocks, the engine holds {truth}: a false hit \
             ({answers:?})"
        );
    }
}

async fn context_blocks(server: &Server) -> u64 {
    let view = http::get(server.http_port, "/global_view").await.json();
    view["contexts"][0]["prefix_count"].as_u64().unwrap_or(0)
}

fn metric(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} "))?.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_context_past_its_cap_answers_shorter_true_prefixes_before_and_after_a_restart() {
    let config = json!({"max_context_blocks": CAP});
    let server = Server::start_with(config.clone()).await;
    let mut player = Player::start(true, 0).await;
    let mut engine = Engine::default();
    register(&server, "e", &player).await;
    // Conversation 0 is announced twice (vLLM's block pool does not deduplicate): the index
    // counts two announcements of each of its blocks.
    handshake(
        &server,
        &mut player,
        "e|default|0",
        engine.store(0, 0, BLOCKS),
    )
    .await;
    player.publish(engine.store(0, 0, BLOCKS)).await;
    for c in 1..CONVERSATIONS {
        player.publish(engine.store(c, 0, BLOCKS / 2)).await;
        player.publish(engine.store(c, BLOCKS / 2, BLOCKS)).await;
    }
    deliver(&server, &mut player, "e|default|0").await;
    // 48 blocks published, a cap of 20: evicted down to 18 at each crossing.
    let blocks = context_blocks(&server).await;
    assert!(
        (1..=CAP).contains(&blocks),
        "{blocks} blocks kept, cap {CAP}"
    );
    let a = answers(&server).await;
    assert_true_prefixes(&a, &engine, "past the cap");
    assert_eq!(
        a[CONVERSATIONS as usize - 1],
        BLOCKS as i64,
        "the newest conversation is kept whole: oldest chains go first ({a:?})"
    );
    assert_eq!(a[0], 0, "the oldest conversation went first ({a:?})");

    // Counted and reported.
    let status = http::get(server.http_port, "/services/status").await.json();
    let budget = &status["memory_budget"];
    assert_eq!(budget["max_context_blocks"], json!(CAP), "{status}");
    let evicted = budget["evicted_blocks"].as_u64().unwrap_or(0);
    assert!(evicted >= 48 - CAP, "{status}");
    assert_eq!(
        budget["contexts"][0]["evicted_blocks"].as_u64(),
        Some(evicted),
        "{status}"
    );
    let metrics = http::get(server.http_port, "/metrics").await.text();
    assert_eq!(
        metric(&metrics, "conductor_index_evicted_blocks_total"),
        Some(evicted),
        "{metrics}"
    );
    let health = http::get(server.http_port, "/health").await;
    assert_eq!(health.status, 200);
    assert_eq!(health.json()["status"], "degraded", "{}", health.text());
    assert!(
        health.json()["reason"]
            .as_str()
            .is_some_and(|r| r.contains("memory budget")),
        "{}",
        health.text()
    );

    // Removals of evicted blocks change nothing; conversation 0 was announced twice, so two
    // removals empty it in the engine. Announced once more and removed once, the engine holds
    // none of it, and the index must not either.
    player.publish(engine.remove_all(0)).await;
    player.publish(engine.remove_all(0)).await;
    player.publish(engine.store(0, 0, BLOCKS)).await;
    player.publish(engine.remove_all(0)).await;
    // A continuation of conversation 1, whose first blocks were evicted: stored, but the walk
    // from the prompt's first block stops at the missing ones.
    player.publish(engine.store(1, BLOCKS / 2, BLOCKS)).await;
    deliver(&server, &mut player, "e|default|0").await;
    let a = answers(&server).await;
    assert_true_prefixes(&a, &engine, "after removals of evicted blocks");
    assert_eq!(a[0], 0, "conversation 0 is held nowhere ({a:?})");
    assert!(context_blocks(&server).await <= CAP);

    // A crash, then a restart with the same cap on the same data directory; the publisher
    // replays what the last checkpoint did not hold.
    let dir = server.into_dir();
    let server = Server::start_in(dir, config).await;
    deliver(&server, &mut player, "e|default|0").await;
    eventually("the cap obeyed after the restart", WAIT, || async {
        (context_blocks(&server).await <= CAP).then_some(())
    })
    .await;
    // Blocks recovered from a checkpoint carry no age, so which of them stay is not asserted;
    // that none answers past what the engine holds is.
    let after = answers(&server).await;
    assert_true_prefixes(&after, &engine, "after the restart");

    // And it keeps obeying it as the engine stores on.
    for c in 10..14 {
        player.publish(engine.store(c, 0, BLOCKS)).await;
    }
    deliver(&server, &mut player, "e|default|0").await;
    assert!(context_blocks(&server).await <= CAP);
    let a = answers(&server).await;
    assert_true_prefixes(&a, &engine, "storing on after the restart");
    let newest = grpc_query(&server, MODEL, tokens(13), BS as i64).await;
    assert_eq!(
        newest.hits.get("e").map(|h| h.device),
        Some((BLOCKS * BS as usize) as i64),
        "the newest prompt answers whole"
    );

    // A clean stop writes the last changes, evictions included: the restart answers the same.
    let before = answers(&server).await;
    let blocks = context_blocks(&server).await;
    let mut server = server;
    assert_eq!(server.terminate(), Some(0));
    let server = Server::start_in(server.into_dir(), json!({"max_context_blocks": CAP})).await;
    assert_eq!(context_blocks(&server).await, blocks);
    assert_eq!(answers(&server).await, before, "ready means recovered");
}
