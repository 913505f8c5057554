//! Scenario load tool: query latency per transport while ingesting, and end-to-end ingest
//! throughput, against the real service on loopback. It prints a report and exits by itself.
//!
//! Modes (`--mode` or `LOAD_MODE`):
//! - `scenario` (default): the service in-process; `instances` x `ranks` subscriptions, each on
//!   its own PUB socket (vLLM DP ranks publish on separate ports), holding prefixes of varying
//!   length of one shared prompt; a churn loop publishes `ingest-rate` block events/s of unrelated
//!   blocks while, per transport (gRPC through [`lean_grpc`], gRPC through the generated tonic
//!   client, HTTP msgpack with token_ids as bin, HTTP JSON) and per
//!   entry of `clients`, that many closed-loop clients query for `secs` s. Then one PUB publishes
//!   `e2e-blocks` blocks as fast as it can to a fresh subscription, timed from first publish to
//!   last block applied.
//! - `serve`: the service alone, configured like the binary (`CONDUCTOR_CONFIG_PATH`), until
//!   SIGINT/SIGTERM or `serve-secs`: a release server that needs no RocksDB build.
//! - `bootstrap`: time for a new replica to be ready from a peer holding `pairs` (default
//!   1000000,10000000) pairs, and the snapshot's bytes per pair (see `bootstrap`).
//! - `rust-query-latency`: `calls` sequential gRPC queries to a running server at `rpc-port`, the
//!   Rust baseline the Python client's latency is compared with.
//! - `trace`: Mooncake's conversation trace replayed through the service in-process by simulated
//!   vLLM engines and a KV-aware router, at `speeds` times the trace's pace or searching for the
//!   highest pace it keeps up with (see `trace`).
//!
//! Run: `cargo bench --no-default-features --bench load [-- --clients 1,8 --secs 10]`.
//! Options are `--name value` or env `LOAD_NAME` (e.g. `LOAD_INGEST_RATE`). Defaults: instances
//! 32, ranks 2, clients 1,4, secs 5, ingest-rate 100000, prompt-len 2048, e2e-blocks 1048576,
//! transports grpc,grpc-tonic,http-msgpack,http-json, client-threads 2 (the service has its own runtime),
//! checkpoint-ms 1000.
//! Column `svc us` is the service's own mean time per query (hashing and walk, from `/metrics`):
//! the rest of a latency is transport, client and scheduling.
mod bootstrap;
mod client;
mod lean_grpc;
mod publish;
mod scenario;
mod service;
mod trace;
mod trace_run;
#[path = "../trace_sim/mod.rs"]
mod trace_sim;

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::OnceLock;
use std::time::Instant;

use client::{grpc, query_request};
use publish::prompt;
use scenario::{Summary, scenario};
use service::serve;

const MODEL: &str = "load-model";
const INGEST_MODEL: &str = "load-ingest";
const BS: u32 = 16;
/// Blocks per churn or ingest event (a BlockStored covers one request's new blocks).
const EVENT_BLOCKS: usize = 16;
/// Events per batch of the end-to-end ingest run.
const E2E_EVENTS: usize = 32;
/// Per-client cap on queries, so a run is bounded in count as well as in time.
const MAX_QUERIES_PER_CLIENT: usize = 2_000_000;

static OPTS: OnceLock<HashMap<String, String>> = OnceLock::new();

/// Options from `LOAD_*` variables, overridden by `--name value` or `--name=value` arguments.
fn parse_opts() -> HashMap<String, String> {
    let mut map: HashMap<String, String> = std::env::vars()
        .filter_map(|(k, v)| Some((k.strip_prefix("LOAD_")?.to_lowercase().replace('_', "-"), v)))
        .collect();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        // `cargo bench` passes `--bench` to harness-less benches; it is not an option here.
        let Some(name) = arg.strip_prefix("--").filter(|n| *n != "bench") else {
            continue;
        };
        match name.split_once('=') {
            Some((k, v)) => map.insert(k.into(), v.into()),
            None => map.insert(name.into(), args.next().unwrap_or_default()),
        };
    }
    map
}

fn opt<T: FromStr>(key: &str, default: T) -> T {
    match OPTS.get_or_init(parse_opts).get(key) {
        None => default,
        Some(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("option {key}: cannot parse {v:?}")),
    }
}

fn main() {
    let mode: String = opt("mode", "scenario".to_owned());
    if mode == "serve" {
        return serve();
    }
    // The clients get their own runtime so they never share worker threads with the service.
    let clients = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(opt("client-threads", 2))
        .enable_all()
        .build()
        .expect("client runtime");
    match mode.as_str() {
        "scenario" => clients.block_on(scenario()),
        "rust-query-latency" => clients.block_on(rust_query_latency()),
        "bootstrap" => clients.block_on(bootstrap::bootstrap()),
        "trace" => clients.block_on(trace::trace()),
        other => {
            panic!("unknown mode {other:?} (scenario, serve, bootstrap, rust-query-latency, trace)")
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The Rust baseline for the Python client's latency.

async fn rust_query_latency() {
    let port: u16 = opt("rpc-port", 0);
    assert!(port != 0, "--rpc-port is required");
    let calls: usize = opt("calls", 2000);
    let tokens = prompt(opt("prompt-len", 2048));
    let request = query_request(
        opt("model", MODEL.to_owned()),
        opt("block-size", BS.into()),
        tokens,
    );
    let mut client = grpc(port).await;
    let mut instances = 0;
    for _ in 0..calls.min(200) {
        instances = client
            .query(request.clone())
            .await
            .expect("query")
            .into_inner()
            .hits
            .len();
    }
    let mut lat = Vec::with_capacity(calls);
    let started = Instant::now();
    for _ in 0..calls {
        let began = Instant::now();
        // As a Python call does: a request from the token list, the round trip, the decoded answer.
        let r = client
            .query(request.clone())
            .await
            .expect("query")
            .into_inner();
        assert_eq!(r.ret, 0);
        lat.push(began.elapsed());
    }
    let s = Summary::of(&mut lat, started.elapsed().as_secs_f64());
    let report = serde_json::json!({
        "calls": s.count, "instances": instances, "qps": s.rate,
        "p50_us": s.p50, "p90_us": s.p90, "p99_us": s.p99, "max_us": s.max, "mean_us": s.mean,
    });
    println!("{report}");
}
