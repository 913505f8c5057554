//! Engines registered by their URL, as both transports see them: the request, what it
//! registered, the status of each engine, and the operations ([`EngineControl`]) that the
//! `engines` module carries out. The gateway depends only on this file; the module that reads
//! engines' descriptions depends on the gateway, not the other way round.

use futures::future::BoxFuture;

use crate::error::OpError;

/// `POST /engines` / `RegisterEngine` as received. `None`: the field was absent.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EngineRequest {
    pub url: Option<String>,
    /// `"vLLM"` (default) or `"SGLang"`.
    pub engine_type: Option<String>,
    pub instance_id: Option<String>,
    pub tenant_id: Option<String>,
    pub model_name: Option<String>,
    pub block_size: Option<i128>,
    pub hash_profile: Option<Vec<(String, String)>>,
    /// An SGLang hybrid model's parts, comma-separated (its description does not say them).
    pub hybrid_parts: Option<String>,
}

/// One DP rank registered for an engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankRegistration {
    pub dp_rank: u32,
    pub endpoint: String,
    /// `""`: the rank has no replay socket.
    pub replay_endpoint: String,
    /// The topic the engine publishes under (reported; the subscription takes every topic).
    pub topic: String,
    pub block_size: u32,
}

/// What an engine registration did: the identity its ranks are registered under and its ranks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineReply {
    pub instance_id: String,
    pub tenant_id: String,
    pub url: String,
    pub engine_type: &'static str,
    pub model_name: String,
    pub ranks: Vec<RankRegistration>,
}

/// One engine's state, for `GET /engines` and `/services/status`.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineStatus {
    pub instance_id: String,
    pub tenant_id: String,
    pub url: String,
    pub engine_type: &'static str,
    pub model_name: String,
    /// Where the engine came from: `"request"`, `"config"` or `"dns"`.
    pub origin: &'static str,
    /// `"ok"`, `"unreadable"` (its description could not be read; its ranks are kept for the
    /// grace) or `"dropped"` (unreadable past the grace; its ranks are unregistered).
    pub state: &'static str,
    /// Ranks the last description read named.
    pub ranks_found: usize,
    /// Ranks registered now.
    pub ranks_registered: usize,
    /// Milliseconds since the description was last read; `None`: never.
    pub description_age_ms: Option<u64>,
    pub last_error: Option<String>,
    /// Milliseconds the description has been unreadable; `None` while it reads.
    pub failing_for_ms: Option<u64>,
}

/// An engine's load figures as it reported them (vLLM: `server_load`; SGLang: per rank).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct EngineLoad {
    pub server_load: Option<u64>,
    /// By DP rank, ascending.
    pub ranks: Vec<(u32, RankLoad)>,
}

/// One DP rank's load (SGLang's `/v1/loads`).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct RankLoad {
    pub running: u64,
    pub waiting: u64,
    pub token_usage: f64,
}

/// The last load read of an engine, and how old it is.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadReport {
    pub age_ms: u64,
    pub load: EngineLoad,
}

/// The engine operations the service provides (see the `engines` module).
pub trait EngineControl: Send + Sync {
    /// Read the engine's description and register each of its ranks.
    fn register(&self, request: EngineRequest) -> BoxFuture<'static, Result<EngineReply, OpError>>;
    /// Stop following an engine and unregister all its ranks; the number of ranks unregistered.
    fn unregister(
        &self,
        instance_id: String,
        tenant_id: String,
    ) -> BoxFuture<'static, Result<usize, OpError>>;
    /// Every engine followed, by (tenant, instance id).
    fn list(&self) -> Vec<EngineStatus>;
    /// The engines' part of `/metrics` (Prometheus text).
    fn render_metrics(&self, w: &mut String);
    /// The last load read of the engine registered as `instance_id` of `tenant_id`.
    fn load(&self, tenant_id: &str, instance_id: &str) -> Option<LoadReport>;
}
