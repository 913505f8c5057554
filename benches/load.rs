//! Scenario load tool: query latency per transport while ingesting, and end-to-end ingest
//! throughput, against the real service on loopback. It prints a report and exits by itself.
//!
//! Modes (`--mode` or `LOAD_MODE`):
//! - `scenario` (default): the service in-process; `instances` x `ranks` subscriptions, each on
//!   its own PUB socket (vLLM DP ranks publish on separate ports), holding prefixes of varying
//!   length of one shared prompt; a churn loop publishes `ingest-rate` block events/s of unrelated
//!   blocks while, per transport (gRPC, HTTP msgpack with token_ids as bin, HTTP JSON) and per
//!   entry of `clients`, that many closed-loop clients query for `secs` s. Then one PUB publishes
//!   `e2e-blocks` blocks as fast as it can to a fresh subscription, timed from first publish to
//!   last block applied.
//! - `serve`: the service alone, configured like the binary (`CONDUCTOR_CONFIG_PATH`), until
//!   SIGINT/SIGTERM or `serve-secs`: a release server that needs no RocksDB build.
//! - `rust-query-latency`: `calls` sequential gRPC queries to a running server at `rpc-port`, the
//!   Rust baseline the Python client's latency is compared with.
//!
//! Run: `cargo bench --no-default-features --bench load [-- --clients 1,8 --secs 10]`.
//! Options are `--name value` or env `LOAD_NAME` (e.g. `LOAD_INGEST_RATE`). Defaults: instances
//! 32, ranks 2, clients 1,4, secs 5, ingest-rate 100000, prompt-len 2048, e2e-blocks 1048576,
//! transports grpc,http-msgpack,http-json, client-threads 2 (the service has its own runtime),
//! checkpoint-ms 1000.
//! Column `svc us` is the service's own mean time per query (hashing and walk, from `/metrics`):
//! the rest of a latency is transport, client and scheduling.

use std::collections::{HashMap, HashSet, VecDeque};
use std::str::FromStr;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use bytes::Bytes;
use mooncake_conductor::config::Config;
use mooncake_conductor::gateway::pb::{self, conductor_client::ConductorClient};
use mooncake_conductor::hashing::{HashProfile, PrefixKeys};
use serde_json::Value as Json;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;
use zeromq::{PubSocket, Socket, SocketSend, ZmqMessage};

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
        other => panic!("unknown mode {other:?} (scenario, serve, rust-query-latency)"),
    }
}

// ---------------------------------------------------------------------------------------------
// The service: in-process on its own thread and runtime, or alone for `serve`.

/// Run the service as `run_until_signal` does, until `shutdown` is cancelled or, with a `limit`,
/// also until SIGINT, SIGTERM or the limit (so a forgotten server still stops by itself).
fn run_service(config: Config, shutdown: CancellationToken, limit: Option<Duration>) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build();
    let system = actix_rt::System::with_tokio_rt(move || runtime.expect("service runtime"));
    let result = system.block_on(async move {
        if let Some(limit) = limit {
            let (stop, mut term) = (
                shutdown.clone(),
                signal(SignalKind::terminate()).expect("SIGTERM"),
            );
            tokio::spawn(async move {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                    _ = tokio::time::sleep(limit) => {}
                }
                stop.cancel();
            });
        }
        mooncake_conductor::service::run(config, shutdown).await
    });
    result.unwrap_or_else(|e| panic!("service failed: {e}"));
}

struct InProcess {
    http_port: u16,
    rpc_port: u16,
    shutdown: CancellationToken,
    thread: std::thread::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().expect("local addr").port()
}

impl InProcess {
    async fn start() -> InProcess {
        let dir = tempfile::tempdir().expect("temp dir");
        let (http_port, rpc_port) = (free_port(), free_port());
        let text = serde_json::json!({
            "http_server_port": http_port, "rpc_server_port": rpc_port,
            "bind_address": "127.0.0.1", "data_dir": dir.path().join("data"),
            // Without RocksDB checkpoints go to an in-memory store; its cost is part of ingest.
            "checkpoint_interval_ms": opt("checkpoint-ms", 1000u64),
        });
        let config = Config::parse(&text.to_string(), "load bench").expect("config");
        let shutdown = CancellationToken::new();
        let token = shutdown.clone();
        let thread = std::thread::spawn(move || run_service(config, token, None));
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(mut c) = HttpConn::connect(http_port).await
                && c.call("GET", "/health", "", b"")
                    .await
                    .is_ok_and(|r| r.0 == 200)
            {
                let _dir = dir;
                return InProcess {
                    http_port,
                    rpc_port,
                    shutdown,
                    thread,
                    _dir,
                };
            }
            assert!(Instant::now() < deadline, "service not ready in 30 s");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn stop(self) {
        self.shutdown.cancel();
        let _ = self.thread.join();
    }
}

fn serve() {
    let (config, origin) = Config::load().unwrap_or_else(|e| panic!("{e}"));
    let limit = Duration::from_secs(opt("serve-secs", 600));
    eprintln!("serving ({origin}) for at most {limit:?}");
    run_service(config, CancellationToken::new(), Some(limit));
}

// ---------------------------------------------------------------------------------------------
// Clients: a keep-alive HTTP/1.1 connection, gRPC, publishers and their payloads.

/// One keep-alive HTTP/1.1 connection (the service always answers with a Content-Length).
struct HttpConn(BufReader<tokio::net::TcpStream>);

impl HttpConn {
    async fn connect(port: u16) -> std::io::Result<HttpConn> {
        let stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        stream.set_nodelay(true)?;
        Ok(HttpConn(BufReader::new(stream)))
    }

    async fn call(
        &mut self,
        method: &str,
        path: &str,
        ctype: &str,
        body: &[u8],
    ) -> std::io::Result<(u16, Vec<u8>)> {
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        // One write per request: a head and body in separate segments would meet Nagle.
        let mut request = head.into_bytes();
        request.extend_from_slice(body);
        self.0.write_all(&request).await?;
        let (mut status, mut length, mut line) = (0u16, 0usize, String::new());
        loop {
            line.clear();
            if self.0.read_line(&mut line).await? == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            let l = line.trim_end();
            if l.is_empty() {
                break;
            } else if let Some(rest) = l.strip_prefix("HTTP/1.1 ") {
                status = rest.get(..3).and_then(|s| s.parse().ok()).unwrap_or(0);
            } else if let Some((k, v)) = l.split_once(':')
                && k.eq_ignore_ascii_case("content-length")
            {
                length = v.trim().parse().unwrap_or(0);
            }
        }
        let mut out = vec![0; length];
        self.0.read_exact(&mut out).await?;
        Ok((status, out))
    }
}

async fn grpc(port: u16) -> ConductorClient<Channel> {
    let url = format!("http://127.0.0.1:{port}");
    let endpoint = tonic::transport::Endpoint::from_shared(url).expect("endpoint");
    ConductorClient::new(
        endpoint
            .tcp_nodelay(true)
            .connect()
            .await
            .expect("gRPC connect"),
    )
}

/// The shared prompt: deterministic token ids in a realistic vocabulary range. The Python
/// benchmark builds the same list.
fn prompt(len: usize) -> Vec<i32> {
    (0..len).map(|i| ((i * 7919 + 17) % 32000) as i32).collect()
}

const PROFILE: [(&str, &str); 4] = [
    ("strategy", "vllm_v1"),
    ("algorithm", "sha256_cbor"),
    ("python_hash_seed", "0"),
    ("index_projection", "low64_be"),
];

/// The event hashes vLLM publishes for the complete blocks of `tokens`.
fn block_keys(tokens: &[i32]) -> Vec<u64> {
    let profile = HashProfile::from_pairs(PROFILE).expect("profile");
    let hasher = profile.hasher("", "");
    let mut chain = hasher.chain(BS, tokens);
    (0..chain.num_blocks()).map(|i| chain.key(i).0).collect()
}

fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

fn query_request(model: String, block_size: i64, tokens: Vec<i32>) -> pb::QueryRequest {
    pb::QueryRequest {
        model_name: model,
        block_size,
        token_ids: tokens,
        ..Default::default()
    }
}

async fn register(c: &mut ConductorClient<Channel>, p: &Publisher, model: &str) {
    let request = pb::RegisterRequest {
        instance_id: Some(p.instance.clone()),
        endpoint: Some(p.endpoint.clone()),
        publisher_type: Some("vLLM".into()),
        model_name: Some(model.into()),
        block_size: Some(BS.into()),
        dp_rank: Some(p.rank.into()),
        has_hash_profile: true,
        hash_profile: PROFILE
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    };
    let reply = c.register(request).await.expect("register").into_inner();
    assert_eq!(reply.ret, 0, "register {}: {:?}", p.service(), reply.error);
}

/// The msgpack values the payloads need, written directly with `rmp` so that encoding stays
/// cheap next to what the service does with them.
enum Mp<'a> {
    Str(&'a str),
    U(u64),
    Nil,
    Us(&'a [u64]),
    Is(&'a [i32]),
    Nils(usize),
    Bin(&'a [u8]),
    Arr(Vec<Mp<'a>>),
    Map(Vec<(&'a str, Mp<'a>)>),
}

fn write(w: &mut Vec<u8>, v: &Mp) {
    use rmp::encode::*;
    const OK: &str = "writing to a Vec cannot fail";
    let len = |n: usize| u32::try_from(n).expect("msgpack length");
    let uint = |w: &mut Vec<u8>, u: u64| _ = write_uint(w, u).expect(OK);
    match v {
        Mp::Str(s) => write_str(w, s).expect(OK),
        Mp::U(u) => uint(w, *u),
        Mp::Nil => write_nil(w).expect(OK),
        Mp::Us(xs) => {
            write_array_len(w, len(xs.len())).expect(OK);
            xs.iter().for_each(|x| uint(w, *x));
        }
        Mp::Is(xs) => {
            write_array_len(w, len(xs.len())).expect(OK);
            xs.iter()
                .for_each(|x| _ = write_sint(w, (*x).into()).expect(OK));
        }
        Mp::Nils(n) => {
            write_array_len(w, len(*n)).expect(OK);
            (0..*n).for_each(|_| write_nil(w).expect(OK));
        }
        Mp::Bin(b) => write_bin(w, b).expect(OK),
        Mp::Arr(items) => {
            write_array_len(w, len(items.len())).expect(OK);
            items.iter().for_each(|v| write(w, v));
        }
        Mp::Map(pairs) => {
            write_map_len(w, len(pairs.len())).expect(OK);
            for (k, v) in pairs {
                write_str(w, k).expect(OK);
                write(w, v);
            }
        }
    }
}

/// A vLLM `BlockStored` map event with every field vLLM sends.
fn stored<'a>(
    hashes: &'a [u64],
    parent: Option<u64>,
    tokens: &'a [i32],
    medium: &'a str,
) -> Mp<'a> {
    Mp::Map(vec![
        ("type", Mp::Str("BlockStored")),
        ("block_hashes", Mp::Us(hashes)),
        ("parent_block_hash", parent.map_or(Mp::Nil, Mp::U)),
        ("token_ids", Mp::Is(tokens)),
        ("block_size", Mp::U(BS.into())),
        ("lora_id", Mp::Nil),
        ("medium", Mp::Str(medium)),
        ("lora_name", Mp::Nil),
        ("extra_keys", Mp::Nils(hashes.len())),
        ("group_idx", Mp::U(0)),
        ("kv_cache_spec_kind", Mp::Str("full_attention")),
    ])
}

fn removed<'a>(hashes: &'a [u64], medium: &'a str) -> Mp<'a> {
    let (kind, group) = (Mp::Str("BlockRemoved"), Mp::U(0));
    Mp::Map(vec![
        ("type", kind),
        ("block_hashes", Mp::Us(hashes)),
        ("medium", Mp::Str(medium)),
        ("group_idx", group),
    ])
}

/// msgspec's `[ts, events, dp_rank]` array batch (ts is float seconds; never read back here).
fn batch(events: Vec<Mp>, rank: u32) -> Bytes {
    let mut w = Vec::new();
    write(
        &mut w,
        &Mp::Arr(vec![
            Mp::U(1_700_000_000),
            Mp::Arr(events),
            Mp::U(rank.into()),
        ]),
    );
    Bytes::from(w)
}

/// An engine's PUB socket: `[topic, seq BE8, payload]` like vLLM.
struct Publisher {
    instance: String,
    rank: u32,
    endpoint: String,
    socket: PubSocket,
    next_seq: u64,
}

impl Publisher {
    async fn bind(instance: String, rank: u32) -> Publisher {
        let mut socket = PubSocket::new();
        let endpoint = socket
            .bind("tcp://127.0.0.1:0")
            .await
            .expect("bind PUB")
            .to_string();
        Publisher {
            instance,
            rank,
            endpoint,
            socket,
            next_seq: 0,
        }
    }

    fn service(&self) -> String {
        format!("{}|default|{}", self.instance, self.rank)
    }

    async fn send_seq(&mut self, seq: u64, payload: Bytes) {
        let parts = vec![
            Bytes::new(),
            Bytes::copy_from_slice(&seq.to_be_bytes()),
            payload,
        ];
        let message = ZmqMessage::try_from(parts).expect("frames");
        self.socket.send(message).await.expect("PUB send");
    }

    async fn publish(&mut self, payload: Bytes) {
        self.next_seq += 1;
        self.send_seq(self.next_seq - 1, payload).await;
    }
}

async fn status(http: &mut HttpConn) -> Vec<Json> {
    let (code, body) = http
        .call("GET", "/services/status", "", b"")
        .await
        .expect("status");
    assert_eq!(code, 200);
    let v: Json = serde_json::from_slice(&body).expect("status JSON");
    v["services"].as_array().cloned().unwrap_or_default()
}

/// Sums over `services`: stored events, removed events, gaps, sources dropped, decode errors.
fn totals(services: &[Json]) -> [u64; 5] {
    let mut t = [0; 5];
    for s in services {
        let fields = [
            &s["events"]["stored"],
            &s["events"]["removed"],
            &s["gaps"],
            &s["sources_dropped"],
            &s["decode_errors"],
        ];
        t.iter_mut()
            .zip(fields)
            .for_each(|(t, v)| *t += v.as_u64().unwrap_or(0));
    }
    t
}

/// The service's own time for queries of `label` (hashing and walk): (sum in s, count).
async fn ops_time(http: &mut HttpConn, label: &str) -> (f64, f64) {
    let (_, body) = http
        .call("GET", "/metrics", "", b"")
        .await
        .expect("metrics");
    let text = String::from_utf8_lossy(&body);
    let read = |name: &str| {
        let prefix = format!("conductor_query_duration_seconds_{name}{{transport=\"{label}\"}} ");
        let value = text.lines().find_map(|l| l.strip_prefix(prefix.as_str()));
        value.and_then(|v| v.trim().parse().ok()).unwrap_or(0.0)
    };
    (read("sum"), read("count"))
}

/// Send each publisher's seq-0 batch again and again until its subscription applied it: a PUB
/// drops what it sends before the SUB's subscription arrived, and duplicates are ignored.
async fn handshake(pubs: &mut [Publisher], first: &[Bytes], http: &mut HttpConn) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let done: HashSet<String> = (status(http).await.iter())
            .filter(|s| s["last_seq"].as_u64().is_some())
            .filter_map(|s| s["service"].as_str().map(str::to_owned))
            .collect();
        let mut pending = 0;
        for (p, payload) in pubs.iter_mut().zip(first) {
            if !done.contains(&p.service()) {
                pending += 1;
                p.send_seq(0, payload.clone()).await;
            }
        }
        if pending == 0 {
            pubs.iter_mut().for_each(|p| p.next_seq = 1);
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{pending} subscriptions never applied seq 0"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// Scenario.

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

async fn scenario() {
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
    let transports = opt("transports", "grpc,http-msgpack,http-json".to_owned());
    for transport in transports.split(',').filter(|t| !t.is_empty()) {
        let transport = ["grpc", "http-msgpack", "http-json"]
            .into_iter()
            .find(|t| *t == transport)
            .unwrap_or_else(|| panic!("unknown transport {transport:?}"));
        for &n in &clients {
            // The service's mean time per query, inside the operation layer (no transport).
            let label = if transport == "grpc" { "grpc" } else { "http" };
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
    let tokens = prompt(EVENT_BLOCKS * BS as usize);
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
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (json, msgpack, request) = (json.clone(), msgpack.clone(), request.clone());
        let (mut g, mut h) = (
            grpc(s.rpc_port).await,
            HttpConn::connect(s.http_port).await.expect("HTTP"),
        );
        tasks.push(tokio::spawn(async move {
            let (mut lat, mut errors) = (Vec::with_capacity(1 << 16), 0u64);
            while Instant::now() < deadline && lat.len() < MAX_QUERIES_PER_CLIENT {
                let began = Instant::now();
                let good = match transport {
                    "grpc" => g.query(request.clone()).await.is_ok_and(|r| {
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
struct Summary {
    count: usize,
    rate: f64,
    p50: f64,
    p90: f64,
    p99: f64,
    max: f64,
    mean: f64,
}

impl Summary {
    fn of(lat: &mut [Duration], secs: f64) -> Summary {
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
