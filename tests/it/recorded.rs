//! The recorded engine payloads (`tests/fixtures/events/*.jsonl`, captured from vLLM 0.33 and
//! SGLang 0.5.23's own publisher classes) served by `mooncake_conductor play` into the running
//! binary: each subscription's counters and the resulting index must match the manifest's
//! decoded events.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};

use crate::support::engine::{Registration, sglang_profile, vllm_cbor_profile};
use crate::support::server::Server;
use crate::support::tool::{self, Tool};
use crate::support::{WAIT, eventually, free_port, http};

fn fixture_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/events")
}

fn hash(v: &Value) -> u64 {
    u64::from_str_radix(v.as_str().expect("hex hash"), 16).expect("hash")
}

/// What the index must hold for the base model after the events: hash → tiers.
fn model(events: &[Value]) -> (BTreeMap<u64, BTreeSet<String>>, Vec<u64>) {
    let mut held: BTreeMap<u64, BTreeSet<String>> = BTreeMap::new();
    let mut order = Vec::new();
    for e in events {
        let tier = e["tier"].as_str().unwrap_or_default().to_owned();
        let hashes: Vec<u64> = e["hashes"]
            .as_array()
            .map(|a| a.iter().map(hash).collect())
            .unwrap_or_default();
        match e["kind"].as_str() {
            Some("stored") if e["lora_name"].is_null() => {
                for h in hashes {
                    held.entry(h).or_default().insert(tier.clone());
                    order.push(h);
                }
            }
            Some("removed") => {
                for h in hashes {
                    if let Some(t) = held.get_mut(&h) {
                        t.remove(&tier);
                    }
                }
            }
            Some("all_cleared") => held.clear(),
            _ => {}
        }
    }
    held.retain(|_, t| !t.is_empty());
    (held, order)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recorded_engine_payloads_index_what_they_say() {
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(fixture_dir().join("manifest.json")).unwrap())
            .unwrap();
    let server = Server::start().await;
    let mut checked = 0;
    let mut players = Vec::new();
    for (n, fixture) in manifest["fixtures"].as_array().unwrap().iter().enumerate() {
        let (name, kind) = (
            fixture["name"].as_str().unwrap(),
            fixture["publisher"].as_str().unwrap(),
        );
        let events = fixture["expect"]["events"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let Some(block_size) = events.iter().find_map(|e| e["block_size"].as_u64()) else {
            continue;
        };
        if kind == "Mooncake" {
            continue; // store events name their own context; covered by e2e_mixed
        }
        let profile = if kind == "SGLang" {
            sglang_profile()
        } else {
            vllm_cbor_profile()
        };
        let rank = fixture["expect"]["dp_rank"].as_u64().unwrap_or(0) as u32;
        let (instance, model_name) = (format!("i{n}"), format!("model-{name}"));
        // The fixture file as its publisher serves it: `play` waits for the subscriber, sends the
        // batch, and re-sends it while it lingers (the Conductor ignores the duplicates; a PUB
        // drops what it sends before the subscription arrived).
        let endpoint = format!("tcp://127.0.0.1:{}", free_port());
        let file = fixture_dir().join(format!("{name}.jsonl"));
        let player = Tool::spawn(&[
            "play",
            file.to_str().unwrap(),
            "--bind",
            &endpoint,
            "--as-fast",
            "--wait-subscriber",
            "20",
            "--linger",
            "1.5",
            "--repeat-last",
            "0.05",
        ]);
        let reg = Registration::new(kind, &instance, &endpoint)
            .model(&model_name)
            .block_size(block_size as u32)
            .rank(rank)
            .profile(profile)
            .json();
        let reply = server.register(&reg).await;
        assert_eq!(reply.ret, 0, "{name}: {:?}", reply.error);
        let service = format!("{instance}|default|{rank}");
        eventually(&format!("{name}: the batch applied"), WAIT, || async {
            let status = http::get(server.http_port, "/services/status").await.json();
            status["services"]
                .as_array()?
                .iter()
                .any(|s| s["service"] == service.as_str() && s["last_seq"] == json!(0))
                .then_some(())
        })
        .await;
        players.push((name.to_owned(), player));

        let count = |k: &str| events.iter().filter(|e| e["kind"] == k).count() as u64;
        let status = http::get(server.http_port, "/services/status").await.json();
        let st = status["services"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["service"] == format!("{instance}|default|{rank}"))
            .unwrap()
            .clone();
        assert_eq!(
            st["events"]["stored"].as_u64(),
            Some(count("stored")),
            "{name}: {st}"
        );
        assert_eq!(
            st["events"]["removed"].as_u64(),
            Some(count("removed")),
            "{name}"
        );
        assert_eq!(
            st["events"]["cleared"].as_u64(),
            Some(count("all_cleared")),
            "{name}"
        );
        let ignored: u64 = st["ignored"]
            .as_object()
            .map_or(0, |m| m.values().filter_map(Value::as_u64).sum());
        assert_eq!(
            ignored,
            fixture["expect"]["ignored"]
                .as_array()
                .map_or(0, |a| a.len() as u64),
            "{name}: {st}"
        );
        assert_eq!(
            st["invalid_events"].as_u64(),
            fixture["expect"]["invalid"]
                .as_array()
                .map(|a| a.len() as u64),
            "{name}"
        );

        let (held, order) = model(&events);
        if order.is_empty() {
            continue;
        }
        let in_prefix = |pred: &dyn Fn(&BTreeSet<String>) -> bool| {
            order
                .iter()
                .take_while(|h| held.get(h).is_some_and(pred))
                .count() as u64
                * block_size
        };
        let want_device = in_prefix(&|t| t.contains("device"));
        let want_any = in_prefix(&|_| true);
        let body = json!({"model": model_name, "block_size": block_size, "block_hashes": order, "instance_id": instance});
        eventually(
            &format!("{name}: index matches the manifest"),
            WAIT,
            || async {
                let r = http::post_json(server.http_port, "/query_by_hash", &body)
                    .await
                    .json();
                let row = &r["instances"][&instance];
                (row["device"].as_u64() == Some(want_device)
                    && row["disk"].as_u64() == Some(want_any))
                .then_some(())
            },
        )
        .await;
        checked += 1;
    }
    for (name, player) in players {
        let out = player.finish(std::time::Duration::from_secs(30)).await;
        assert!(out.status.success(), "{name}: {}", tool::stderr(&out));
    }
    assert!(
        checked >= 6,
        "most recorded fixtures leave blocks to check, got {checked}"
    );
}
