//! The transport's bounds against the real binary: gRPC refuses unauthenticated and oversized
//! messages before buffering them, and a flood of idle connections at a low descriptor limit
//! neither spins the accept loop nor keeps `/health` out, and is closed after the idle timeouts;
//! nor does a flood that opens connections faster than the cap can age.

use std::time::{Duration, Instant};

use mooncake_conductor::gateway::pb;
use serde_json::json;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

use crate::support::flood::idle_flood;
use crate::support::memory::{memory, reset_peak};
use crate::support::server::Server;
use crate::support::{http, poll};

const MIB: u64 = 1 << 20;
const UNAUTHORIZED: i32 = -2002;

/// A `Query` of about `bytes` bytes: token ids of five varint bytes each.
fn huge_query(bytes: usize) -> pb::QueryRequest {
    pb::QueryRequest {
        model_name: "m".into(),
        block_size: 16,
        token_ids: vec![0x1000_0000; bytes / 5],
        ..Default::default()
    }
}

/// Send `count` concurrent queries of `bytes` each, with no token; returns each outcome.
async fn concurrent_queries(
    server: &Server,
    count: usize,
    bytes: usize,
) -> Vec<Result<pb::QueryResponse, tonic::Status>> {
    let calls = (0..count).map(|_| {
        let port = server.rpc_port;
        tokio::spawn(async move {
            let endpoint = format!("http://127.0.0.1:{port}");
            let mut client = pb::conductor_client::ConductorClient::connect(endpoint)
                .await
                .expect("gRPC connect");
            let call = client.query(huge_query(bytes));
            match tokio::time::timeout(Duration::from_secs(60), call).await {
                Ok(answer) => answer.map(tonic::Response::into_inner),
                Err(_) => panic!("query not answered within 60 s"),
            }
        })
    });
    let mut outcomes = Vec::new();
    for call in calls.collect::<Vec<_>>() {
        outcomes.push(call.await.expect("query task"));
    }
    outcomes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unauthenticated_grpc_queries_are_refused_before_their_messages_are_read() {
    let server = Server::start_with(json!({"auth_token": "s3cret", "auth_reads": true})).await;
    let before = reset_peak(&server);
    let outcomes = concurrent_queries(&server, 4, 60 * MIB as usize).await;
    let (peak, _) = memory(&server);
    for outcome in outcomes {
        let reply = outcome.expect("an answer, not a transport error");
        assert_eq!(reply.ret, UNAUTHORIZED, "{:?}", reply.error);
    }
    let grown = peak.saturating_sub(before);
    assert!(
        grown < 64 * MIB,
        "four unauthenticated 60 MiB queries grew the peak RSS by {} MiB",
        grown / MIB
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_grpc_query_above_what_its_token_cap_allows_is_refused_from_its_prefix() {
    let server = Server::start_with(json!({"max_query_tokens": 10_000})).await;
    let before = reset_peak(&server);
    let outcomes = concurrent_queries(&server, 4, 60 * MIB as usize).await;
    let (peak, _) = memory(&server);
    for outcome in outcomes {
        let status = outcome.expect_err("refused as a transport error");
        assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
        assert!(status.message().contains("Query"), "{status:?}");
    }
    let grown = peak.saturating_sub(before);
    assert!(grown < 64 * MIB, "peak RSS grew by {} MiB", grown / MIB);
    // A query within the cap is still answered.
    let mut client = server.grpc().await;
    let ok = client.query(huge_query(5_000)).await.expect("answered");
    assert_eq!(ok.into_inner().ret, 0);
}

/// CPU time (user + system) of the process, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which may hold spaces): utime and stime are 14 and 15.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// `/health` answers 200 within 3 s.
async fn health_answers(port: u16) -> bool {
    let answered = poll(Duration::from_secs(3), async || {
        let r = http::try_request(port, "GET", "/health", &[], b"");
        match tokio::time::timeout(Duration::from_secs(1), r).await {
            Ok(Ok(resp)) if resp.status == 200 => Ok(()),
            _ => Err(()),
        }
    });
    answered.await.is_ok()
}

/// Read until the server closes the socket; `false` if it is still open at `deadline`.
async fn closed_by(mut socket: TcpStream, deadline: Instant) -> bool {
    let mut buf = [0u8; 256];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, socket.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            // An error answer (a 408 for a head never sent): the close follows.
            Ok(Ok(_)) => continue,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_flood_at_a_low_descriptor_limit_keeps_health_up_and_is_closed() {
    let config = json!({
        "connection_idle_timeout_ms": 3000,
        "http_header_read_timeout_ms": 2000,
    });
    let server = Server::start_with_nofile(config, 256).await;
    let mut idle = Vec::new();
    for i in 0..300 {
        let port = if i % 2 == 0 {
            server.http_port
        } else {
            server.rpc_port
        };
        let connect = TcpStream::connect(("127.0.0.1", port));
        match tokio::time::timeout(Duration::from_secs(5), connect).await {
            Ok(Ok(socket)) => idle.push(socket),
            other => panic!("connection {i} not established: {other:?}"),
        }
    }
    let ticks = cpu_ticks(server.pid());
    let window = Instant::now();
    for round in 0..5 {
        assert!(
            health_answers(server.http_port).await,
            "/health not answered in round {round} with 300 idle connections:\n{}",
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let spent = cpu_ticks(server.pid()) - ticks;
    let elapsed = window.elapsed().as_secs_f64();
    // 100 ticks per second of one core: an accept loop spinning on EMFILE takes most of one.
    assert!(
        (spent as f64) < elapsed * 100.0 * 0.3,
        "{spent} ticks of CPU in {elapsed:.1} s while idle connections were held"
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    let closes: Vec<_> = idle.into_iter().map(|s| closed_by(s, deadline)).collect();
    let still_open = futures::future::join_all(closes)
        .await
        .into_iter()
        .filter(|closed| !closed)
        .count();
    assert_eq!(still_open, 0, "idle connections still open after 20 s");
    let metrics = http::get(server.http_port, "/metrics").await.text();
    let count = |name: &str| -> u64 {
        let line = metrics.lines().find(|l| l.starts_with(&format!("{name} ")));
        line.and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
            .unwrap_or_else(|| panic!("{name} not in /metrics:\n{metrics}"))
    };
    let max = count("conductor_connections_max");
    assert!(max < 256, "the cap follows the descriptor limit: {max}");
    let turned_away =
        count("conductor_connections_refused_total") + count("conductor_connections_evicted_total");
    assert!(turned_away > 0, "300 connections over a cap of {max}");
    assert!(count("conductor_connections_idle_closed_total") > 0);
    assert!(health_answers(server.http_port).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_faster_than_the_cap_can_age_keeps_health_and_queries_up() {
    let server = Server::start_with(json!({"max_connections": 64})).await;
    let ports = [server.http_port, server.rpc_port];
    // 1,500 a second for 3 s: every slot is younger than a tenth of a second throughout.
    let flood =
        tokio::spawn(async move { idle_flood(&ports, 1_500, Duration::from_secs(3), 256).await });
    let query = json!({"model": "m", "block_size": 4, "token_ids": (1..9).collect::<Vec<i32>>()});
    let query = serde_json::to_vec(&query).expect("JSON");
    let json = [("Content-Type", "application/json")];
    // Per path: probes sent, and answered 200.
    let (mut health, mut queries) = ((0u32, 0u32), (0u32, 0u32));
    while !flood.is_finished() {
        let on_health = health.0 <= queries.0;
        let probe = if on_health {
            http::try_request(server.http_port, "GET", "/health", &[], b"")
        } else {
            http::try_request(server.http_port, "POST", "/query", &json, &query)
        };
        // A bound on a probe that is never answered, not a latency requirement.
        let ok = matches!(
            tokio::time::timeout(Duration::from_secs(5), probe).await,
            Ok(Ok(r)) if r.status == 200
        );
        let counts = if on_health { &mut health } else { &mut queries };
        counts.0 += 1;
        counts.1 += u32::from(ok);
    }
    let flooded = flood.await.expect("flood task");
    assert!(
        flooded.per_second() >= 1_000.0,
        "the flood opened only {flooded:?}: not the flood this test is about"
    );
    for (path, (probes, answered)) in [("/health", health), ("/query", queries)] {
        assert!(probes >= 5, "{probes} {path} probes in {flooded:?}");
        assert!(
            f64::from(answered) >= 0.8 * f64::from(probes),
            "{path} answered {answered} of {probes} probes during {flooded:?}:\n{}",
            server.log()
        );
    }
}
