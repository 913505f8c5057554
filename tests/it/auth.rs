//! The shared token: registration changes need it over HTTP and gRPC, reads only with
//! `auth_reads`, `/health` never; several tokens overlap during a rotation; the environment
//! variable overrides the file; the token never reaches the log.

use mooncake_conductor::gateway::pb;
use serde_json::{Value, json};
use tonic::metadata::MetadataValue;

use crate::support::api::reg;
use crate::support::engine::Registration;
use crate::support::grpc::register_request;
use crate::support::server::Server;
use crate::support::{free_port, http};

/// The result code of a refused token (the error table in `src/error.rs`).
const UNAUTHORIZED: i32 = -2002;

async fn post(
    server: &Server,
    path: &str,
    body: &Value,
    token: Option<&str>,
) -> http::HttpResponse {
    let bytes = serde_json::to_vec(body).expect("encode JSON");
    let bearer = token.map(|t| format!("Bearer {t}"));
    let mut headers = vec![("Content-Type", "application/json")];
    if let Some(b) = bearer.as_deref() {
        headers.push(("Authorization", b));
    }
    http::request(server.http_port, "POST", path, &headers, &bytes).await
}

async fn get(server: &Server, path: &str, token: Option<&str>) -> http::HttpResponse {
    let bearer = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = bearer
        .as_deref()
        .map(|b| vec![("Authorization", b)])
        .unwrap_or_default();
    http::request(server.http_port, "GET", path, &headers, b"").await
}

fn assert_refused(r: &http::HttpResponse, what: &str) {
    assert_eq!(r.status, 401, "{what}: {}", r.text());
    let j = r.json();
    assert_eq!(j["reason"], "unauthorized", "{what}: {j}");
    assert!(
        j["error"]
            .as_str()
            .is_some_and(|e| e.contains("Authorization")),
        "{what}: {j}"
    );
    assert_eq!(r.header("www-authenticate"), Some("Bearer"), "{what}");
}

fn unregister_body(instance: &str) -> Value {
    json!({"instance_id": instance, "dp_rank": 0})
}

fn query_body() -> Value {
    json!({"model": "m", "block_size": 16, "token_ids": [1, 2, 3]})
}

async fn service_ids(server: &Server) -> Vec<String> {
    let listing = get(server, "/services", Some("old-token")).await.json();
    listing["services"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|s| s["InstanceID"].as_str().unwrap_or_default().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// The reply of one gRPC call; a transport error fails the test, naming the method.
macro_rules! reply {
    ($client:ident . $method:ident ($request:expr)) => {
        $client
            .$method($request)
            .await
            .expect(stringify!($method))
            .into_inner()
    };
}

fn with_token<T>(message: T, token: Option<&str>) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some(t) = token {
        let value: MetadataValue<_> = format!("Bearer {t}").parse().expect("metadata");
        request.metadata_mut().insert("authorization", value);
    }
    request
}

fn grpc_registration(instance: &str) -> pb::RegisterRequest {
    let endpoint = format!("tcp://127.0.0.1:{}", free_port());
    register_request(
        &Registration::vllm(instance, &endpoint)
            .block_size(16)
            .json(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_registration_changes_need_the_token_and_reads_stay_open() {
    // Two tokens: the one being retired and its successor are both accepted during a rotation.
    let server = Server::start_with(json!({"auth_token": "old-token,new-token"})).await;
    let body = reg("e0", free_port());

    assert_refused(&post(&server, "/register", &body, None).await, "no token");
    assert_refused(
        &post(&server, "/register", &body, Some("wrong-token")).await,
        "a wrong token",
    );
    assert_refused(
        &post(&server, "/register", &body, Some("old-toke")).await,
        "a prefix of a token",
    );
    let basic = http::request(
        server.http_port,
        "POST",
        "/register",
        &[
            ("Content-Type", "application/json"),
            ("Authorization", "Basic b2xkLXRva2Vu"),
        ],
        &serde_json::to_vec(&body).unwrap(),
    )
    .await;
    assert_refused(&basic, "another scheme");
    assert!(service_ids(&server).await.is_empty(), "nothing registered");

    let r = post(&server, "/register", &body, Some("old-token")).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = post(
        &server,
        "/register",
        &reg("e1", free_port()),
        Some("new-token"),
    )
    .await;
    assert_eq!(r.status, 200, "the successor token: {}", r.text());

    // Reads need no token by default.
    for path in [
        "/services",
        "/services/status",
        "/global_view",
        "/metrics",
        "/health",
    ] {
        assert_eq!(get(&server, path, None).await.status, 200, "{path}");
    }
    let r = post(&server, "/query", &query_body(), None).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.json()["instances"]["e0"].is_object(), "{}", r.text());

    assert_refused(
        &post(&server, "/unregister", &unregister_body("e0"), None).await,
        "unregister without a token",
    );
    assert_eq!(service_ids(&server).await, ["e0", "e1"]);
    let r = post(
        &server,
        "/unregister",
        &unregister_body("e0"),
        Some("new-token"),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(service_ids(&server).await, ["e1"]);

    let log = server.log();
    assert!(
        !log.contains("old-token") && !log.contains("new-token") && !log.contains("wrong-token"),
        "a token reached the log:\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_registration_changes_need_the_token_in_metadata() {
    let server = Server::start_with(json!({"auth_token": "old-token"})).await;
    let mut client = server.grpc().await;

    let reply = reply!(client.register(with_token(grpc_registration("g0"), None)));
    assert_eq!(reply.ret, UNAUTHORIZED, "{:?}", reply.error);
    let error = reply.error.expect("error detail");
    assert_eq!(error.reason, "unauthorized");
    let reply = reply!(client.register(with_token(grpc_registration("g0"), Some("bad"))));
    assert_eq!(reply.ret, UNAUTHORIZED);
    let reply = reply!(client.register(with_token(grpc_registration("g0"), Some("old-token"))));
    assert_eq!(reply.ret, 0, "{:?}", reply.error);

    // Reads stay open.
    let listing = reply!(client.list_services(with_token(pb::ListServicesRequest {}, None)));
    assert_eq!((listing.ret, listing.count), (0, 1));
    let query = pb::QueryRequest {
        model_name: "m".into(),
        block_size: 16,
        token_ids: vec![1, 2, 3],
        ..Default::default()
    };
    let hits = reply!(client.query(with_token(query, None)));
    assert_eq!(hits.ret, 0);
    assert!(hits.hits.contains_key("g0"), "{hits:?}");

    let unregister = pb::UnregisterRequest {
        instance_id: "g0".into(),
        tenant_id: String::new(),
        dp_rank: 0,
    };
    let reply = reply!(client.unregister(with_token(unregister.clone(), None)));
    assert_eq!(reply.ret, UNAUTHORIZED);
    let reply = reply!(client.unregister(with_token(unregister, Some("old-token"))));
    assert_eq!(reply.ret, 0, "{:?}", reply.error);
    assert!(!server.log().contains("old-token"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_auth_reads_every_read_needs_the_token_but_health() {
    let server = Server::start_with(json!({"auth_token": "old-token", "auth_reads": true})).await;
    let r = post(
        &server,
        "/register",
        &reg("e0", free_port()),
        Some("old-token"),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());

    for path in ["/services", "/services/status", "/global_view", "/metrics"] {
        assert_refused(&get(&server, path, None).await, path);
        assert_eq!(
            get(&server, path, Some("old-token")).await.status,
            200,
            "{path}"
        );
    }
    // A load balancer probes /health without credentials.
    assert_eq!(get(&server, "/health", None).await.status, 200);
    for path in ["/query", "/query_by_hash"] {
        assert_refused(&post(&server, path, &query_body(), None).await, path);
    }
    let r = post(&server, "/query", &query_body(), Some("old-token")).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.json()["instances"]["e0"].is_object(), "{}", r.text());

    let mut client = server.grpc().await;
    let listing = reply!(client.list_services(with_token(pb::ListServicesRequest {}, None)));
    assert_eq!((listing.ret, listing.count), (UNAUTHORIZED, 0));
    let view = reply!(client.get_global_view(with_token(pb::GetGlobalViewRequest {}, None)));
    assert_eq!((view.ret, view.context_count), (UNAUTHORIZED, 0));
    let query = pb::QueryRequest {
        model_name: "m".into(),
        block_size: 16,
        token_ids: vec![1, 2, 3],
        ..Default::default()
    };
    let hits = reply!(client.query(with_token(query.clone(), None)));
    assert_eq!(hits.ret, UNAUTHORIZED);
    assert!(hits.hits.is_empty());
    let by_hash = pb::QueryByHashRequest {
        model_name: "m".into(),
        block_size: 16,
        block_hashes: vec![1],
        ..Default::default()
    };
    let hits = reply!(client.query_by_hash(with_token(by_hash, None)));
    assert_eq!(hits.ret, UNAUTHORIZED);
    let hits = reply!(client.query(with_token(query, Some("old-token"))));
    assert_eq!(hits.ret, 0);
    assert!(hits.hits.contains_key("e0"), "{hits:?}");
    let health = reply!(client.health(with_token(pb::HealthRequest {}, None)));
    assert!(health.ready, "Health stays open: {health:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_environment_variable_overrides_the_file() {
    let server = Server::start_with_env(
        json!({"auth_token": "file-token"}),
        &[("CONDUCTOR_AUTH_TOKEN", "env-token")],
    )
    .await;
    let body = reg("e0", free_port());
    assert_refused(
        &post(&server, "/register", &body, Some("file-token")).await,
        "the file's token",
    );
    let r = post(&server, "/register", &body, Some("env-token")).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let log = server.log();
    assert!(
        !log.contains("env-token") && !log.contains("file-token"),
        "{log}"
    );
}
