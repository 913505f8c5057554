//! Clients: a keep-alive HTTP/1.1 connection, gRPC, and readers of the service's status and
//! metrics.

use mooncake_conductor::gateway::pb::{self, conductor_client::ConductorClient};
use serde_json::Value as Json;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tonic::transport::Channel;

use crate::BS;
use crate::publish::{PROFILE, Publisher};

/// One keep-alive HTTP/1.1 connection (the service always answers with a Content-Length).
pub(crate) struct HttpConn(BufReader<tokio::net::TcpStream>);

impl HttpConn {
    pub(crate) async fn connect(port: u16) -> std::io::Result<HttpConn> {
        let stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        stream.set_nodelay(true)?;
        Ok(HttpConn(BufReader::new(stream)))
    }

    pub(crate) async fn call(
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

pub(crate) async fn grpc(port: u16) -> ConductorClient<Channel> {
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

pub(crate) fn query_request(model: String, block_size: i64, tokens: Vec<i32>) -> pb::QueryRequest {
    pb::QueryRequest {
        model_name: model,
        block_size,
        token_ids: tokens,
        ..Default::default()
    }
}

/// A vLLM registration of the bench's block size and hash profile.
pub(crate) fn register_request(
    instance: &str,
    endpoint: &str,
    replay_endpoint: Option<String>,
    model: &str,
    rank: u32,
) -> pb::RegisterRequest {
    pb::RegisterRequest {
        instance_id: Some(instance.into()),
        endpoint: Some(endpoint.into()),
        replay_endpoint,
        publisher_type: Some("vLLM".into()),
        model_name: Some(model.into()),
        block_size: Some(BS.into()),
        dp_rank: Some(rank.into()),
        has_hash_profile: true,
        hash_profile: PROFILE
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    }
}

pub(crate) async fn register(c: &mut ConductorClient<Channel>, p: &Publisher, model: &str) {
    let request = register_request(&p.instance, &p.endpoint, None, model, p.rank);
    let reply = c.register(request).await.expect("register").into_inner();
    assert_eq!(reply.ret, 0, "register {}: {:?}", p.service(), reply.error);
}

pub(crate) async fn status(http: &mut HttpConn) -> Vec<Json> {
    let (code, body) = http
        .call("GET", "/services/status", "", b"")
        .await
        .expect("status");
    assert_eq!(code, 200);
    let v: Json = serde_json::from_slice(&body).expect("status JSON");
    v["services"].as_array().cloned().unwrap_or_default()
}

/// Sums over `services`: stored events, removed events, gaps, sources dropped, decode errors.
pub(crate) fn totals(services: &[Json]) -> [u64; 5] {
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
pub(crate) async fn ops_time(http: &mut HttpConn, label: &str) -> (f64, f64) {
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
