//! The scenario: populate the subscriptions, query per transport while churning, and time an
//! end-to-end ingest.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytes::Bytes;
use mooncake_conductor::gateway::pb;
use prost::Message;
use serde_json::Value as Json;
use tokio_util::sync::CancellationToken;

use crate::client::{HttpConn, grpc, ops_time, query_request, register, status, totals};
use crate::lean_grpc::{LeanGrpc, QUERY, framed, ret_and_instances};
use crate::publish::{
    Mp, Publisher, batch, block_keys, handshake, mix, prompt, removed, stored, write,
};
use crate::service::InProcess;
use crate::{BS, E2E_EVENTS, EVENT_BLOCKS, INGEST_MODEL, MAX_QUERIES_PER_CLIENT, MODEL, opt};

/// Blocks of the shared prompt held by (instance, rank): instance `i` holds a prefix growing
/// with `i` (the last holds all of it) on GPU; rank 1 and later hold half of that on CPU.
fn held_blocks(i: usize, rank: u32, instances: usize, total: usize) -> usize {
    let n = (total * (i + 1) / instances).max(1);
    if rank == 0 { n } else { (n / 2).max(1) }
}

/// Bind, register and populate every (instance, rank); returns once a query sees all of it.
async fn populate(s: &InProcess, instances: usize, ranks: u32, tokens: &[i32]) -> Vec<Publisher> {
    let keys = block_keys(tokens);
    let (mut http, mut client) = (
        HttpConn::connect(s.http_port).await.expect("HTTP"),
        grpc(s.rpc_port).await,
    );
    let mut pubs = Vec::new();
    for (i, rank) in (0..instances).flat_map(|i| (0..ranks).map(move |r| (i, r))) {
        let p = Publisher::bind(format!("inst-{i}"), rank).await;
        register(&mut client, &p, MODEL).await;
        pubs.push(p);
    }
    let first: Vec<Bytes> = (pubs.iter().enumerate())
        .map(|(k, p)| {
            let n = held_blocks(k / ranks as usize, p.rank, instances, keys.len());
            let medium = if p.rank == 0 { "GPU" } else { "CPU" };
            batch(
                vec![stored(&keys[..n], None, &tokens[..n * BS as usize], medium)],
                p.rank,
            )
        })
        .collect();
    handshake(&mut pubs, &first, &mut http).await;
    // The index applies after the subscription routed a batch: wait for the full answer.
    let request = query_request(MODEL.into(), BS.into(), tokens.to_vec());
    let (full, last) = (
        (keys.len() * BS as usize) as i64,
        format!("inst-{}", instances - 1),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = client
            .query(request.clone())
            .await
            .expect("query")
            .into_inner();
        if r.hits.len() == instances && r.hits.get(&last).is_some_and(|h| h.device == full) {
            let mut device: Vec<i64> = r.hits.values().map(|h| h.device).collect();
            device.sort_unstable();
            let (n, mid, max) = (
                pubs.len(),
                device[device.len() / 2],
                device[device.len() - 1],
            );
            println!(
                "populated {n} subscriptions; answer: {instances} instances, device tokens min {} / median {mid} / max {max}",
                device[0]
            );
            return pubs;
        }
        assert!(Instant::now() < deadline, "population never became visible");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub(crate) async fn scenario() {
    let (instances, ranks): (usize, u32) = (opt("instances", 32), opt("ranks", 2));
    let clients: Vec<usize> = (opt("clients", "1,4".to_owned()).split(','))
        .map(|c| {
            c.trim()
                .parse()
                .expect("--clients: a comma-separated list of counts")
        })
        .collect();
    let (secs, rate): (f64, f64) = (opt("secs", 5.0), opt("ingest-rate", 100_000.0));
    let tokens = prompt(opt("prompt-len", 2048));
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "load: {instances} instances x {ranks} ranks, clients {clients:?} per transport, {secs} s per run, \
         ingest target {rate} block events/s, prompt {} tokens, {cpus} CPUs",
        tokens.len()
    );
    let service = InProcess::start().await;
    let pubs = populate(&service, instances, ranks, &tokens).await;
    let mut http = HttpConn::connect(service.http_port).await.expect("HTTP");
    let stop = CancellationToken::new();
    let churn_task = tokio::spawn(churn(pubs, rate, stop.clone()));
    let before = (Instant::now(), totals(&status(&mut http).await));
    let head = [
        "clients", "queries", "q/s", "p50 us", "p90 us", "p99 us", "max us", "errors", "svc us",
    ];
    println!(
        "\n{:<13}{}",
        "transport",
        head.map(|h| format!("{h:>9}")).concat()
    );
    let transports = opt(
        "transports",
        "grpc,grpc-tonic,http-msgpack,http-json".to_owned(),
    );
    for transport in transports.split(',').filter(|t| !t.is_empty()) {
        let transport = ["grpc", "grpc-tonic", "http-msgpack", "http-json"]
            .into_iter()
            .find(|t| *t == transport)
            .unwrap_or_else(|| panic!("unknown transport {transport:?}"));
        for &n in &clients {
            // The service's mean time per query, inside the operation layer (no transport).
            let label = if transport.starts_with("grpc") {
                "grpc"
            } else {
                "http"
            };
            let ops_before = ops_time(&mut http, label).await;
            let (mut lat, errors) =
                run_clients(transport, n, secs, &service, &tokens, instances).await;
            let ops = ops_time(&mut http, label).await;
            let svc_us = (ops.0 - ops_before.0) / (ops.1 - ops_before.1).max(1.0) * 1e6;
            let s = Summary::of(&mut lat, secs);
            let row = [s.rate, s.p50, s.p90, s.p99, s.max]
                .map(|v| format!("{v:>9.1}"))
                .concat();
            println!(
                "{transport:<13}{n:>9}{:>9}{row}{errors:>9}{svc_us:>9.1}",
                s.count
            );
        }
    }
    let after = (Instant::now(), totals(&status(&mut http).await));
    stop.cancel();
    let published = churn_task.await.expect("churn task");
    let span = (after.0 - before.0).as_secs_f64();
    let d = |i: usize| after.1[i] - before.1[i];
    let applied = (d(0) + d(1)) * EVENT_BLOCKS as u64;
    println!(
        "ingest during queries: published {:.0}, applied {:.0} block events/s (stored+removed, \
         over {span:.1} s); gaps {}, sources dropped {}, decode errors {}",
        published as f64 / span,
        applied as f64 / span,
        d(2),
        d(3),
        d(4),
    );
    let e2e_blocks: u64 = opt("e2e-blocks", 1 << 20);
    if e2e_blocks > 0 {
        e2e_ingest(&service, &mut http, e2e_blocks).await;
    }
    service.stop();
}

/// Publish `rate` block events/s of unrelated blocks round-robin over the publishers: a
/// BlockStored of new blocks plus, once warm, a BlockRemoved of the oldest live ones per batch.
/// The target follows the clock, so a late tick catches up (by at most a few ticks' worth).
async fn churn(mut pubs: Vec<Publisher>, rate: f64, stop: CancellationToken) -> u64 {
    // Unrelated blocks have their own token ids too: the index keys blocks by their contents,
    // so blocks that differ only in their published hashes would be one block under many names.
    let mut tokens = prompt(EVENT_BLOCKS * BS as usize);
    let mut live: Vec<VecDeque<Vec<u64>>> = pubs.iter().map(|_| VecDeque::new()).collect();
    let tick = Duration::from_millis(5);
    let mut interval = tokio::time::interval(tick);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let (start, mut floor, mut sent, mut counter) = (Instant::now(), 0u64, 0u64, 0u64);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return sent,
            _ = interval.tick() => {}
        }
        let target = (start.elapsed().as_secs_f64() * rate) as u64;
        floor = floor.max(target.saturating_sub((rate * tick.as_secs_f64() * 4.0) as u64));
        let mut due = floor.max(sent);
        while due < target {
            let k = (counter as usize) % pubs.len();
            let hashes: Vec<u64> = (0..EVENT_BLOCKS as u64)
                .map(|b| mix(counter << 8 | b))
                .collect();
            counter += 1;
            let parent = live[k].back().and_then(|v| v.last().copied());
            let old = if live[k].len() >= 64 {
                live[k].pop_front()
            } else {
                None
            };
            tokens.iter_mut().for_each(|t| *t = (*t + 7919) % 32000);
            let mut events = vec![stored(&hashes, parent, &tokens, "GPU")];
            events.extend(old.as_deref().map(|old| removed(old, "GPU")));
            let n = (events.len() * EVENT_BLOCKS) as u64;
            let payload = batch(events, pubs[k].rank);
            pubs[k].publish(payload).await;
            (sent, due) = (sent + n, due + n);
            live[k].push_back(hashes);
        }
    }
}

/// `clients` concurrent closed-loop clients for `secs`: latencies of the good answers and the
/// number of failed ones. A good gRPC answer lists every instance; a good HTTP answer is a 200.
async fn run_clients(
    transport: &'static str,
    clients: usize,
    secs: f64,
    s: &InProcess,
    tokens: &[i32],
    instances: usize,
) -> (Vec<Duration>, u64) {
    let json = serde_json::json!({"model": MODEL, "block_size": BS, "token_ids": tokens});
    let json = Bytes::from(serde_json::to_vec(&json).expect("JSON"));
    let packed: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
    let mut msgpack = Vec::new();
    let fields = vec![
        ("model", Mp::Str(MODEL)),
        ("block_size", Mp::U(BS.into())),
        ("token_ids", Mp::Bin(&packed)),
    ];
    write(&mut msgpack, &Mp::Map(fields));
    let msgpack = Bytes::from(msgpack);
    let request = query_request(MODEL.into(), BS.into(), tokens.to_vec());
    let framed = framed(&request);
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (json, msgpack, request) = (json.clone(), msgpack.clone(), request.clone());
        let framed = framed.clone();
        let (mut g, mut lean, mut h) = (
            grpc(s.rpc_port).await,
            LeanGrpc::connect(s.rpc_port).await.expect("gRPC"),
            HttpConn::connect(s.http_port).await.expect("HTTP"),
        );
        // The lean check must agree with a full decode of the same answer.
        let answer = lean.unary(QUERY, &framed).await.expect("lean query");
        let decoded = pb::QueryResponse::decode(answer.clone()).expect("a QueryResponse");
        assert_eq!(
            ret_and_instances(&answer),
            Some((decoded.ret, decoded.hits.len()))
        );
        tasks.push(tokio::spawn(async move {
            let (mut lat, mut errors) = (Vec::with_capacity(1 << 16), 0u64);
            while Instant::now() < deadline && lat.len() < MAX_QUERIES_PER_CLIENT {
                let began = Instant::now();
                let good = match transport {
                    "grpc" => lean
                        .unary(QUERY, &framed)
                        .await
                        .is_ok_and(|answer| ret_and_instances(&answer) == Some((0, instances))),
                    "grpc-tonic" => g.query(request.clone()).await.is_ok_and(|r| {
                        let r = r.into_inner();
                        r.ret == 0 && r.hits.len() == instances
                    }),
                    "http-msgpack" => h
                        .call("POST", "/query", "application/msgpack", &msgpack)
                        .await
                        .is_ok_and(|r| r.0 == 200),
                    _ => h
                        .call("POST", "/query", "application/json", &json)
                        .await
                        .is_ok_and(|r| r.0 == 200),
                };
                let took = began.elapsed();
                if good { lat.push(took) } else { errors += 1 }
            }
            (lat, errors)
        }));
    }
    let (mut all, mut errors) = (Vec::new(), 0);
    for task in tasks {
        let (lat, e) = task.await.expect("client task");
        all.extend(lat);
        errors += e;
    }
    (all, errors)
}

/// Latency figures in microseconds: nearest-rank percentiles of the sorted sample.
pub(crate) struct Summary {
    pub(crate) count: usize,
    pub(crate) rate: f64,
    pub(crate) p50: f64,
    pub(crate) p90: f64,
    pub(crate) p99: f64,
    pub(crate) max: f64,
    pub(crate) mean: f64,
}

impl Summary {
    pub(crate) fn of(lat: &mut [Duration], secs: f64) -> Summary {
        lat.sort_unstable();
        let n = lat.len();
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        let at = |p: f64| {
            if n == 0 {
                0.0
            } else {
                us(lat[((p * n as f64).ceil() as usize).clamp(1, n) - 1])
            }
        };
        let (p50, p90, p99, max) = (at(0.50), at(0.90), at(0.99), at(1.0));
        let mean = us(lat.iter().sum()) / n.max(1) as f64;
        Summary {
            count: n,
            rate: n as f64 / secs,
            p50,
            p90,
            p99,
            max,
            mean,
        }
    }
}

/// One PUB, batches of `E2E_EVENTS` x `EVENT_BLOCKS` new blocks published back to back (built
/// beforehand so encoding is not timed), until the last block is visible to QueryByHash: the
/// context applies batches in order, so then every earlier block is in the index too. The PUB
/// queue (100 000 messages) holds the whole run, so a slow subscriber pushes back, never drops.
async fn e2e_ingest(s: &InProcess, http: &mut HttpConn, blocks: u64) {
    let mut client = grpc(s.rpc_port).await;
    let mut p = Publisher::bind("ingest".into(), 0).await;
    register(&mut client, &p, INGEST_MODEL).await;
    let tokens = prompt(EVENT_BLOCKS * BS as usize);
    let hello = batch(
        vec![stored(&[u64::MAX], None, &tokens[..BS as usize], "GPU")],
        0,
    );
    handshake(std::slice::from_mut(&mut p), &[hello], http).await;
    let per_batch = (E2E_EVENTS * EVENT_BLOCKS) as u64;
    let batches = blocks.div_ceil(per_batch);
    let hash = |b: u64| mix(b ^ 0x5eed_0000_0000);
    let payloads: Vec<Bytes> = (0..batches)
        .map(|b| {
            let hashes: Vec<u64> = (b * per_batch..(b + 1) * per_batch).map(hash).collect();
            let events = hashes
                .chunks(EVENT_BLOCKS)
                .map(|h| stored(h, Some(h[0] ^ 1), &tokens, "GPU"));
            batch(events.collect(), 0)
        })
        .collect();
    let bytes: usize = payloads.iter().map(Bytes::len).sum();
    let probe = pb::QueryByHashRequest {
        model_name: INGEST_MODEL.into(),
        block_size: BS.into(),
        block_hashes: vec![hash(batches * per_batch - 1)],
        ..Default::default()
    };
    let started = Instant::now();
    for payload in payloads {
        p.publish(payload).await;
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let r = client
            .query_by_hash(probe.clone())
            .await
            .expect("probe")
            .into_inner();
        if r.hits.get("ingest").is_some_and(|h| h.device == BS as i64) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "end-to-end ingest: last block not applied in 120 s"
        );
        tokio::time::sleep(Duration::from_micros(500)).await;
    }
    let applied = started.elapsed();
    let mine: Vec<Json> = (status(http).await.into_iter())
        .filter(|v| v["service"] == "ingest|default|0")
        .collect();
    let [stored_events, _, gaps, dropped, _] = totals(&mine);
    let n = (batches * per_batch) as f64;
    println!(
        "end-to-end ingest: {n} blocks in {batches} batches of {E2E_EVENTS}x{EVENT_BLOCKS} blocks \
         ({:.1} MB): last applied {:.0} ms after the first publish: {:.0} blocks/s end to end; \
         stored events {} of {}, gaps {gaps}, dropped {dropped}",
        bytes as f64 / 1e6,
        applied.as_secs_f64() * 1e3,
        n / applied.as_secs_f64(),
        stored_events - 1,
        batches * E2E_EVENTS as u64,
    );
}
