//! An engine's HTTP server as the Conductor reads it, on a free loopback port: vLLM's
//! `/kv_event_sources` and `/v1/models`, SGLang's `/server_info`, answering whatever the test
//! sets, or failing on purpose (an error status, a huge body, a slow answer). The shapes are
//! the engines' own (docs/engine-discovery.md); the publishers beside it are real PUB sockets.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Value, json};

/// How the server answers.
#[derive(Clone, Debug)]
pub enum Mode {
    Serve,
    /// Every route answers this status.
    Fail(u16),
    /// Every route answers a 200 of this many bytes (a JSON string of `x`).
    Huge(usize),
    /// Every route waits this long first.
    Slow(Duration),
}

#[derive(Clone)]
struct Shared {
    /// The route's body by path.
    routes: Arc<Mutex<Vec<(String, Value)>>>,
    mode: Arc<Mutex<Mode>>,
    /// Requests received, any route.
    requests: Arc<std::sync::atomic::AtomicUsize>,
}

pub struct EngineHttp {
    pub url: String,
    shared: Shared,
    server: tokio::task::JoinHandle<()>,
}

impl EngineHttp {
    pub async fn start() -> EngineHttp {
        let shared = Shared {
            routes: Arc::default(),
            mode: Arc::new(Mutex::new(Mode::Serve)),
            requests: Arc::default(),
        };
        let app = Router::new()
            .route("/kv_event_sources", get(answer))
            .route("/v1/models", get(answer))
            .route("/server_info", get(answer))
            .route("/load", get(answer))
            .route("/v1/loads", get(answer))
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        EngineHttp {
            url,
            shared,
            server,
        }
    }

    pub fn set(&self, path: &str, body: Value) {
        let mut routes = self.shared.routes.lock().unwrap();
        routes.retain(|(p, _)| p != path);
        routes.push((path.to_owned(), body));
    }

    /// Requests received so far, any route.
    pub fn requests(&self) -> usize {
        self.shared
            .requests
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    pub fn mode(&self, mode: Mode) {
        *self.shared.mode.lock().unwrap() = mode;
    }

    /// A vLLM engine: one `KVEventsConfig` per rank (`(rank, endpoint as the engine reports
    /// it)`), and its served model.
    pub fn vllm(&self, ranks: &[(u32, String)], model: &str) {
        let sources: serde_json::Map<String, Value> = ranks
            .iter()
            .map(|(rank, endpoint)| {
                let config = json!({
                    "enable_kv_cache_events": true, "publisher": "zmq", "endpoint": endpoint,
                    "replay_endpoint": null, "buffer_steps": 10000, "hwm": 100000,
                    "max_queue_size": 100000, "topic": "",
                });
                (rank.to_string(), config)
            })
            .collect();
        self.set("/kv_event_sources", Value::Object(sources));
        self.set(
            "/v1/models",
            json!({"object": "list", "data": [{"id": model, "object": "model", "owned_by": "vllm"}]}),
        );
    }

    /// An SGLang engine: its `kv_event_sources` (`(rank, endpoint)`) with `block_size`.
    pub fn sglang(&self, ranks: &[(u32, String)], model: &str, block_size: u32) {
        let sources: Vec<Value> = ranks
            .iter()
            .map(|(rank, endpoint)| {
                json!({"dp_rank": rank, "endpoint": endpoint, "topic": "", "block_size": block_size})
            })
            .collect();
        self.set(
            "/server_info",
            json!({"served_model_name": model, "page_size": block_size, "kv_event_sources": sources}),
        );
    }
}

impl Drop for EngineHttp {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// A publisher's endpoint as an engine bound on every interface reports it.
pub fn wildcard(endpoint: &str) -> String {
    let port = endpoint.rsplit(':').next().unwrap();
    format!("tcp://*:{port}")
}

async fn answer(State(shared): State<Shared>, uri: axum::http::Uri) -> Response {
    (shared.requests).fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let mode = shared.mode.lock().unwrap().clone();
    match mode {
        Mode::Serve => {}
        Mode::Fail(status) => return StatusCode::from_u16(status).unwrap().into_response(),
        Mode::Huge(n) => return format!("\"{}\"", "x".repeat(n)).into_response(),
        Mode::Slow(d) => tokio::time::sleep(d).await,
    }
    let body = {
        let routes = shared.routes.lock().unwrap();
        routes
            .iter()
            .find(|(p, _)| p == uri.path())
            .map(|(_, b)| b.clone())
    };
    match body {
        Some(body) => (
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            body.to_string(),
        )
            .into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}
