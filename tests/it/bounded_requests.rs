//! Request bodies cost memory in proportion to their size, never to what they claim to hold:
//! peak RSS of the service measured around hostile bodies, the token cap on both transports, and
//! the budget for large bodies in flight.

use std::time::{Duration, Instant};

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::http;
use crate::support::memory::{MIB, memory, reset_peak};
use crate::support::query::grpc_query;
use crate::support::server::Server;
use crate::support::{WAIT, until};

/// A msgpack map of `head` pairs, then `key` holding an array of `n` fixints.
fn msgpack_body(head: &[(&str, rmpv::Value)], key: &str, n: usize) -> Vec<u8> {
    let mut out = vec![0x80 | (head.len() as u8 + 1)];
    for (k, v) in head {
        rmpv::encode::write_value(&mut out, &rmpv::Value::from(*k)).unwrap();
        rmpv::encode::write_value(&mut out, v).unwrap();
    }
    rmpv::encode::write_value(&mut out, &rmpv::Value::from(key)).unwrap();
    out.push(0xdd);
    out.extend_from_slice(&(n as u32).to_be_bytes());
    out.resize(out.len() + n, 0x01);
    out
}

/// POST `body` and return (status, reason, field, peak RSS above the RSS before it).
async fn peak_of(server: &Server, path: &str, ct: &str, body: &[u8]) -> (u16, String, String, u64) {
    let before = reset_peak(server);
    let r = http::request(
        server.http_port,
        "POST",
        path,
        &[("Content-Type", ct)],
        body,
    )
    .await;
    let (peak, _) = memory(server);
    let reply = if ct.contains("msgpack") {
        r.msgpack()
    } else {
        r.json()
    };
    let text = |k: &str| reply[k].as_str().unwrap_or_default().to_owned();
    (
        r.status,
        text("reason"),
        text("field"),
        peak.saturating_sub(before),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_60_mb_body_of_fixints_costs_about_its_size_whatever_field_holds_it() {
    let server = Server::start_with(json!({"http_body_limit_bytes": 128 * MIB})).await;
    let n = 60_000_000;
    let rank = || ("dp_rank", rmpv::Value::from(0));
    let cases = [
        // Unknown key: its value is skipped unread.
        (
            "/unregister",
            msgpack_body(&[("instance_id", "x".into()), rank()], "bogus", n),
            "unknown_field",
            "bogus",
        ),
        // A string field given an array: only its type is kept.
        (
            "/unregister",
            msgpack_body(&[rank()], "instance_id", n),
            "invalid_type",
            "instance_id",
        ),
        // Tokens: refused by their count before any is decoded.
        (
            "/query",
            msgpack_body(
                &[("model", "m".into()), ("block_size", 16.into())],
                "token_ids",
                n,
            ),
            "too_large",
            "token_ids",
        ),
    ];
    for (path, body, reason, field) in cases {
        let (status, got_reason, got_field, peak) =
            peak_of(&server, path, "application/msgpack", &body).await;
        eprintln!(
            "{path} {field}: {} MB body, peak +{} MiB",
            body.len() / 1_000_000,
            peak / MIB
        );
        assert_eq!(
            (status, got_reason.as_str(), got_field.as_str()),
            (400, reason, field)
        );
        assert!(peak < 512 * MIB, "{path} {field}: peak +{} MiB", peak / MIB);
        assert!(
            peak < 3 * body.len() as u64,
            "{path} {field}: peak +{} MiB",
            peak / MIB
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_30_mb_json_query_costs_about_its_size() {
    let server = Server::start_with(json!({"http_body_limit_bytes": 64 * MIB})).await;
    // 15 M one-digit tokens, over the default cap of 4 Mi.
    let mut body = br#"{"model": "m", "block_size": 16, "token_ids": ["#.to_vec();
    body.extend(std::iter::repeat_n(*b"1,", 15_000_000).flatten());
    body.extend_from_slice(b"1]}");
    let (status, reason, field, peak) = peak_of(&server, "/query", "application/json", &body).await;
    eprintln!(
        "/query JSON: {} MB body, peak +{} MiB",
        body.len() / 1_000_000,
        peak / MIB
    );
    assert_eq!(
        (status, reason.as_str(), field.as_str()),
        (400, "too_large", "token_ids")
    );
    assert!(peak < 3 * body.len() as u64, "peak +{} MiB", peak / MIB);

    // Under the cap the tokens are decoded and queried: 4 Mi tokens, ~33 MB of JSON.
    let max = 4 << 20;
    let mut body = br#"{"model": "m", "block_size": 16, "token_ids": ["#.to_vec();
    body.extend(std::iter::repeat_n(*b"1234567,", max - 1).flatten());
    body.extend_from_slice(b"1234567]}");
    let (status, _, _, peak) = peak_of(&server, "/query", "application/json", &body).await;
    eprintln!(
        "/query JSON at the cap: {} MB body, peak +{} MiB",
        body.len() / 1_000_000,
        peak / MIB
    );
    assert_eq!(status, 200);
    assert!(peak < 3 * body.len() as u64, "peak +{} MiB", peak / MIB);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_query_tokens_is_refused_on_both_transports_naming_the_field() {
    let server = Server::start_with(json!({"max_query_tokens": 100})).await;
    let query = |n: usize| json!({"model": "m", "block_size": 4, "token_ids": vec![1; n]});
    let r = http::post_json(server.http_port, "/query", &query(100)).await;
    assert_eq!((r.status, r.json()), (200, json!({"instances": {}})));
    let r = http::post_json(server.http_port, "/query", &query(101)).await;
    let e = r.json();
    assert_eq!(
        (r.status, &e["reason"], &e["field"]),
        (400, &json!("too_large"), &json!("token_ids"))
    );
    let message = e["error"].as_str().unwrap();
    assert!(
        message.contains("max_query_tokens") && message.contains("100"),
        "{message}"
    );
    let hashes = json!({"model": "m", "block_size": 4, "block_hashes": vec![7; 101]});
    let r = http::post_json(server.http_port, "/query_by_hash", &hashes).await;
    assert_eq!(
        (r.status, &r.json()["field"]),
        (400, &json!("block_hashes"))
    );

    let reply = grpc_query(&server, "m", vec![1; 100], 4).await;
    assert_eq!(reply.ret, 0, "{:?}", reply.error);
    let reply = grpc_query(&server, "m", vec![1; 101], 4).await;
    let error = reply.error.expect("an error");
    assert_ne!(reply.ret, 0);
    assert_eq!(
        (error.field.as_str(), error.reason.as_str()),
        ("token_ids", "too_large")
    );
}

/// Send the head of a POST and `sent` of its `len` body bytes, and keep the connection open.
async fn start_upload(server: &Server, len: usize, sent: usize) -> tokio::net::TcpStream {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", server.http_port))
        .await
        .unwrap();
    let head = format!(
        "POST /unregister HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {len}\r\n\r\n"
    );
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(&vec![b' '; sent]).await.unwrap();
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_bodies_in_flight_share_a_budget_and_small_ones_pass_meanwhile() {
    let config = json!({"http_body_limit_bytes": 8 * MIB, "http_inflight_body_bytes": 5 * MIB});
    let server = Server::start_with(config).await;
    let len = 3 * MIB as usize;
    // A slow upload holds 3 MiB of the 5 MiB budget.
    let mut slow = start_upload(&server, len, 1024).await;

    // A second large body cannot get its share: refused after a bounded wait. Nothing reports
    // the budget, so the refusal itself shows the slow upload's share is held: a large body
    // sent before the server read the slow upload's head still finds room, is answered at once
    // and gives its share back, and is sent again.
    let (r, waited) = until(WAIT, async || {
        let started = Instant::now();
        let r = http::request(
            server.http_port,
            "POST",
            "/unregister",
            &[("Content-Type", "application/json")],
            &vec![b' '; len],
        )
        .await;
        match r.status {
            503 => Ok((r, started.elapsed())),
            _ => Err(format!(
                "waiting for the slow upload to hold its share: {} {}",
                r.status,
                r.text()
            )),
        }
    })
    .await;
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(
        r.json()["error"]
            .as_str()
            .unwrap()
            .contains("http_inflight_body_bytes")
    );
    assert!(waited < Duration::from_secs(10));

    // Small bodies pass meanwhile.
    let r = http::post_json(
        server.http_port,
        "/query",
        &json!({"model": "m", "block_size": 4, "token_ids": [1]}),
    )
    .await;
    assert_eq!(r.status, 200);

    // The slow upload completes and is answered; its share returns to the budget.
    slow.write_all(&vec![b' '; len - 1024 - 2]).await.unwrap();
    slow.write_all(b"{}").await.unwrap();
    let mut raw = Vec::new();
    slow.read_to_end(&mut raw).await.unwrap();
    assert!(
        raw.starts_with(b"HTTP/1.1 400"),
        "{}",
        String::from_utf8_lossy(&raw)
    );
    let mut big = vec![b' '; len];
    big.extend_from_slice(br#"{"instance_id": "nobody", "dp_rank": 0}"#);
    let r = http::request(
        server.http_port,
        "POST",
        "/unregister",
        &[("Content-Type", "application/json")],
        &big,
    )
    .await;
    assert_eq!(r.status, 404, "{}", r.text());
}
