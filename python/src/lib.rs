//! `mooncake._conductor`: the native half of `mooncake.conductor` (see `docs/python-api.md`).
//!
//! Layout: `lib.rs` holds the `ConductorClient` class and its connection lifecycle, `register.rs`
//! the checks of `register()` configurations, `convert.rs` the Python <-> protobuf conversions,
//! `codes.rs` the result codes and the transport-error mapping, `transport.rs` the HTTP/2
//! connection the generated tonic client sends its calls through.
//!
//! Each client owns a single-threaded tokio runtime; every call blocks on it with the GIL
//! released, so other Python threads run while a request is on the network. The calling thread
//! itself drives the call and the connection (see `transport.rs`): no other thread has to wake up
//! for a request to leave or for its answer to be read. Between calls a small thread looks after
//! the connection (`idle.rs`).

mod codes;
mod convert;
mod idle;
mod register;
mod tls;
mod transport;

/// Generated from `proto/conductor.proto` by `build.rs` (client side only).
pub(crate) mod pb {
    tonic::include_proto!("mooncake.conductor.v1");
}

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::PyDict;
use tokio::runtime::Runtime;
use tonic::metadata::AsciiMetadataValue;
use tonic::{Request, Response, Status};
use transport::Transport;

use codes::{
    CONDUCTOR_UNAVAILABLE, HEALTH_NOT_INITIALIZED, HEALTH_OK, HEALTH_UNREACHABLE, INTERNAL_ERROR,
    INVALID_PARAMS, OK, RPC_FAIL, RPC_TIMEOUT,
};

/// The service token, if the service requires one: the same variable the service reads.
const AUTH_TOKEN_ENV: &str = "CONDUCTOR_AUTH_TOKEN";

type RpcClient = pb::conductor_client::ConductorClient<Transport>;

/// Read responses (global view, service lists) grow with the fleet; tonic's 4 MiB default would
/// turn a large but healthy deployment into RPC_FAIL.
const MAX_RESPONSE_BYTES: usize = 64 << 20;

/// Timeouts are clamped to this many milliseconds (about 24 days) so that deadline arithmetic and
/// the `grpc-timeout` header stay in range for absurdly large inputs.
const MAX_TIMEOUT_MS: i64 = i32::MAX as i64;

/// How long close() waits for the connection to end (it does at once unless a call of another
/// thread is still on it).
const CLOSE_WAIT: Duration = Duration::from_millis(100);

/// An established connection: what a successful `setup()` leaves behind.
struct Connection {
    /// Cheap to clone (the connection is shared), so calls never hold the lock while on the network.
    client: RpcClient,
    /// The connection `client` sends through, kept to close it.
    transport: Transport,
    meta: Meta,
    /// Only for `repr()`.
    addr: String,
}

/// Client of the Conductor RPC service.
///
/// Creates an unconnected client. Call setup() before making requests. The client supports `with`
/// statements: entering returns the client, and exiting calls close(), including when the body
/// raises an exception. Entering does not call setup() automatically.
#[pyclass(frozen, module = "mooncake._conductor")]
pub struct ConductorClient {
    /// Created by the first setup(), not in the constructor: a client that is never connected
    /// starts no threads, and a process may still fork safely before connecting.
    runtime: OnceLock<Arc<Runtime>>,
    /// `None` before setup(), after close() and after a failed setup().
    conn: Mutex<Option<Connection>>,
}

impl ConductorClient {
    fn conn(&self) -> MutexGuard<'_, Option<Connection>> {
        // A panic while the lock was held cannot leave the Option half-written; keep going.
        self.conn.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn runtime(&self) -> Option<&Runtime> {
        if let Some(rt) = self.runtime.get() {
            return Some(rt);
        }
        // Single-threaded, so that a call runs on its caller's thread; see `idle.rs`.
        let rt = idle::runtime().ok()?;
        // Losing a race with another thread's setup() just drops our spare runtime.
        let _ = self.runtime.set(rt);
        self.runtime.get().map(|rt| &**rt)
    }

    /// Runs one RPC on the current connection with the request timeout, GIL released.
    /// `Err` carries the result code: CONDUCTOR_UNAVAILABLE when not connected, else a transport code.
    fn call<T, F, Fut>(&self, py: Python<'_>, rpc: F) -> Result<T, i32>
    where
        F: FnOnce(RpcClient, Meta) -> Fut + Send,
        Fut: Future<Output = Result<Response<T>, Status>> + Send,
        T: Send,
    {
        let (client, meta) = match self.conn().as_ref() {
            Some(c) => (c.client.clone(), c.meta.clone()),
            None => return Err(CONDUCTOR_UNAVAILABLE),
        };
        let rt = self.runtime.get().ok_or(CONDUCTOR_UNAVAILABLE)?;
        let timeout = meta.timeout;
        py.detach(move || {
            rt.block_on(async move {
                // The local timer is authoritative; the header only lets the server give up early.
                match tokio::time::timeout(timeout, rpc(client, meta)).await {
                    Ok(Ok(resp)) => Ok(resp.into_inner()),
                    Ok(Err(status)) => Err(codes::from_status(&status)),
                    Err(_elapsed) => Err(RPC_TIMEOUT),
                }
            })
        })
    }
}

/// What every request of a connection carries besides its message.
#[derive(Clone)]
struct Meta {
    timeout: Duration,
    /// `Bearer <token>`, sent as `authorization` metadata when the variable is set.
    authorization: Option<AsciiMetadataValue>,
}

/// A request carrying the deadline as `grpc-timeout`, and the token if there is one.
fn request<T>(message: T, meta: &Meta) -> Request<T> {
    let mut req = Request::new(message);
    req.set_timeout(meta.timeout);
    if let Some(value) = &meta.authorization {
        req.metadata_mut().insert("authorization", value.clone());
    }
    req
}

/// `Bearer <token>` from `CONDUCTOR_AUTH_TOKEN`: `Ok(None)` when unset or empty, `Err` when it
/// cannot travel as metadata. The service accepts a comma-separated list during a rotation;
/// a client that shares its environment sends the first entry.
fn authorization_from_env() -> Result<Option<AsciiMetadataValue>, ()> {
    let Ok(text) = std::env::var(AUTH_TOKEN_ENV) else {
        return Ok(None);
    };
    let token = text.split(',').next().unwrap_or("").trim();
    if token.is_empty() {
        return Ok(None);
    }
    if !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(());
    }
    format!("Bearer {token}").parse().map(Some).map_err(|_| ())
}

fn millis(ms: i64) -> Option<Duration> {
    (ms > 0).then(|| Duration::from_millis(ms.min(MAX_TIMEOUT_MS) as u64))
}

/// Connects and proves the peer is a Conductor by one Health round trip, all within `timeout`.
///
/// The TCP connect and HTTP/2 preface alone succeed against any listening socket, so without the
/// round trip a wrong port would pass setup() and fail only at the first request.
async fn connect(transport: Transport, meta: &Meta, timeout: Duration) -> Result<RpcClient, i32> {
    let attempt = async {
        transport.connect().await.map_err(|_| RPC_FAIL)?;
        let mut client =
            RpcClient::new(transport.clone()).max_decoding_message_size(MAX_RESPONSE_BYTES);
        let probe = Meta {
            timeout,
            ..meta.clone()
        };
        match client.health(request(pb::HealthRequest {}, &probe)).await {
            // A recovering server (ready == false) is still a reachable Conductor.
            Ok(_) => Ok(client),
            // A server without Health still answered in gRPC: the connection is good.
            Err(s) if s.code() == tonic::Code::Unimplemented => Ok(client),
            Err(_) => Err(RPC_FAIL),
        }
    };
    // Not answering within connect_timeout_ms is a failure to connect, hence RPC_FAIL.
    tokio::time::timeout(timeout, attempt)
        .await
        .unwrap_or(Err(RPC_FAIL))
}

#[pymethods]
impl ConductorClient {
    #[new]
    fn new() -> Self {
        ConductorClient {
            runtime: OnceLock::new(),
            conn: Mutex::new(None),
        }
    }

    /// Connects to the Conductor RPC service at `conductor_addr` ("host:port", no URL scheme).
    ///
    /// Each attempt replaces the previous connection; a failed attempt leaves the client
    /// uninitialized. The connection is established and checked before returning, within
    /// `connect_timeout_ms`; `request_timeout_ms` bounds each later request.
    ///
    /// Returns OK, INVALID_PARAMS for an address without a port separator (or a malformed one), a
    /// non-positive timeout or a `CONDUCTOR_AUTH_TOKEN` that is not visible ASCII, RPC_FAIL when
    /// the service cannot be reached within the timeout. The token variable is read here: every
    /// request of this connection sends it as `authorization: Bearer <token>`.
    #[pyo3(signature = (conductor_addr, connect_timeout_ms = 1000, request_timeout_ms = 3000))]
    fn setup(
        &self,
        py: Python<'_>,
        conductor_addr: String,
        connect_timeout_ms: i64,
        request_timeout_ms: i64,
    ) -> i32 {
        // Dropped first, so that every failure below leaves the client uninitialized.
        *self.conn() = None;
        let (Some(uri), Some(connect_timeout), Some(request_timeout)) = (
            codes::endpoint_uri(&conductor_addr),
            millis(connect_timeout_ms),
            millis(request_timeout_ms),
        ) else {
            return INVALID_PARAMS;
        };
        if uri.parse::<http::Uri>().is_err() {
            return INVALID_PARAMS;
        }
        let Ok(authorization) = authorization_from_env() else {
            return INVALID_PARAMS;
        };
        // `CONDUCTOR_TLS_CA` (and `CONDUCTOR_TLS_DOMAIN`): an unusable CA or name is a bad
        // parameter, like a bad token.
        let host = conductor_addr.rsplit_once(':').map_or("", |(host, _)| host);
        let Ok(tls) = tls::from_env(host) else {
            return INVALID_PARAMS;
        };
        let uri = match &tls {
            Some(_) => uri.replacen("http://", "https://", 1),
            None => uri,
        };
        let meta = Meta {
            timeout: request_timeout,
            authorization,
        };
        let transport = Transport::new(conductor_addr.clone(), uri, connect_timeout, tls);
        let Some(rt) = self.runtime() else {
            return INTERNAL_ERROR;
        };
        match py.detach(|| rt.block_on(connect(transport.clone(), &meta, connect_timeout))) {
            Ok(client) => {
                *self.conn() = Some(Connection {
                    client,
                    transport,
                    meta,
                    addr: conductor_addr,
                });
                OK
            }
            Err(code) => code,
        }
    }

    /// Releases the RPC connection. Repeated calls are safe. This does not unregister publishers
    /// from the server. The client returns to the uninitialized state. Always returns OK.
    fn close(&self, py: Python<'_>) -> i32 {
        let closed = self.conn().take();
        if let (Some(conn), Some(rt)) = (closed, self.runtime.get()) {
            // The server sees the connection end now, not at the idle thread's next look.
            py.detach(|| rt.block_on(conn.transport.close(CLOSE_WAIT)));
        }
        OK
    }

    /// Probes the service by listing registered services.
    ///
    /// Returns HEALTH_OK (0) if the probe succeeds, HEALTH_NOT_INITIALIZED (1) before a successful
    /// setup(), after close() or after a failed setup(), HEALTH_UNREACHABLE (2) if the probe of an
    /// initialized client fails.
    fn health_check(&self, py: Python<'_>) -> i32 {
        if self.conn().is_none() {
            return HEALTH_NOT_INITIALIZED;
        }
        match self.call(py, |mut c, t| async move {
            c.list_services(request(pb::ListServicesRequest {}, &t))
                .await
        }) {
            Ok(resp) if resp.ret == OK => HEALTH_OK,
            Err(CONDUCTOR_UNAVAILABLE) => HEALTH_NOT_INITIALIZED,
            _ => HEALTH_UNREACHABLE,
        }
    }

    /// Queries continuous prefix-cache matches for a prompt; arguments after `model_name` are
    /// keyword-only.
    ///
    /// Returns {"ret": int, "hits": dict}: hits maps instance IDs to longest_matched, dp,
    /// rank_matches, device, cpu_local, cpu_share and disk (cumulative token counts; rank keys are
    /// decimal strings). On failure ret is negative and hits is {}. Token IDs that are not
    /// representable as signed 32-bit integers give INVALID_PARAMS. With include_load=True the
    /// result also has "loads", with include_status=True "status": per instance how sure its
    /// figures are ("exact", "upper_bound" or "lower_bound", with a reason), per rank with the
    /// state and lag of its subscription and the KV-cache groups of a hybrid model. Both are {}
    /// on failure.
    #[pyo3(
        text_signature = "(self, model_name, *, lora_name='', block_size, tenant_id='default', token_ids, cache_salt='', instance_filter='', include_load=False, include_status=False)"
    )]
    #[pyo3(signature = (
        model_name,
        *,
        lora_name = String::new(),
        block_size,
        tenant_id = String::from("default"),
        token_ids,
        cache_salt = String::new(),
        instance_filter = String::new(),
        include_load = false,
        include_status = false,
    ))]
    #[allow(clippy::too_many_arguments)] // The keyword-only signature is the documented API.
    fn query<'py>(
        &self,
        py: Python<'py>,
        model_name: String,
        lora_name: String,
        block_size: i64,
        tenant_id: String,
        token_ids: &Bound<'py, PyAny>,
        cache_salt: String,
        instance_filter: String,
        include_load: bool,
        include_status: bool,
    ) -> PyResult<Bound<'py, PyDict>> {
        let extras = convert::Extras {
            load: include_load,
            status: include_status,
        };
        let Some(token_ids) = convert::token_ids(token_ids)? else {
            return convert::query_result(py, INVALID_PARAMS, None, extras);
        };
        let msg = pb::QueryRequest {
            model_name,
            lora_name,
            block_size,
            tenant_id,
            token_ids,
            cache_salt,
            instance_filter,
            include_load,
            include_status,
        };
        match self.call(
            py,
            |mut c, t| async move { c.query(request(msg, &t)).await },
        ) {
            Ok(resp) if resp.ret == OK => convert::query_result(py, OK, Some(resp), extras),
            Ok(resp) => convert::query_result(py, resp.ret, None, extras),
            Err(code) => convert::query_result(py, code, None, extras),
        }
    }

    /// Registers one publisher subscription described by `config` (Python field names).
    ///
    /// Returns OK or a negative code; the server answers INVALID_PARAMS for missing required
    /// values, unsupported hash recipes and invalid values. Raises ValueError if `config` is not a
    /// dict, has unknown or non-string keys, wrong value types (bool is not an int), integers
    /// outside int64 or an unknown publisher_type; the same key/type rules apply to hash_profile.
    fn register(&self, py: Python<'_>, config: &Bound<'_, PyAny>) -> PyResult<i32> {
        let msg = register::parse(config)?;
        Ok(
            match self.call(
                py,
                |mut c, t| async move { c.register(request(msg, &t)).await },
            ) {
                Ok(resp) => resp.ret,
                Err(code) => code,
            },
        )
    }

    /// Registers an engine by its HTTP URL: the server reads the engine's own description of its
    /// DP ranks (vLLM `/kv_event_sources`, SGLang `/server_info`), registers one subscription per
    /// rank and keeps them in step with the engine.
    ///
    /// Returns {"ret", "instance_id", "model_name", "ranks"}: each rank a dict with dp_rank,
    /// endpoint, replay_endpoint, topic and block_size. On failure ret is negative, the other
    /// values empty. Raises ValueError for a hash_profile that is not a dict of strings with
    /// known keys.
    #[pyo3(signature = (
        url,
        publisher_type = String::from("vLLM"),
        *,
        instance_id = None,
        tenant_id = String::from("default"),
        model_name = None,
        block_size = None,
        hash_profile = None,
        hybrid_parts = None,
    ))]
    #[pyo3(
        text_signature = "(self, url, publisher_type='vLLM', *, instance_id=None, tenant_id='default', model_name=None, block_size=None, hash_profile=None, hybrid_parts=None)"
    )]
    #[allow(clippy::too_many_arguments)] // The keyword arguments are the documented API.
    fn register_engine<'py>(
        &self,
        py: Python<'py>,
        url: String,
        publisher_type: String,
        instance_id: Option<String>,
        tenant_id: String,
        model_name: Option<String>,
        block_size: Option<i64>,
        hash_profile: Option<&Bound<'py, PyAny>>,
        hybrid_parts: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let hybrid_parts = match hybrid_parts {
            Some(p) => register::hybrid_parts(p)?,
            None => None,
        };
        let profile = match hash_profile {
            Some(p) if !p.is_none() => Some(register::hash_profile(p)?),
            _ => None,
        };
        let msg = pb::RegisterEngineRequest {
            url: Some(url),
            publisher_type: Some(publisher_type),
            instance_id,
            tenant_id: Some(tenant_id),
            model_name,
            block_size,
            has_hash_profile: profile.is_some(),
            hash_profile: profile.unwrap_or_default(),
            hybrid_parts,
        };
        match self.call(py, |mut c, t| async move {
            c.register_engine(request(msg, &t)).await
        }) {
            Ok(resp) => convert::engine(py, resp.ret, Some(resp)),
            Err(code) => convert::engine(py, code, None),
        }
    }

    /// Stops following an engine and unregisters all its ranks.
    ///
    /// Returns OK, SERVICE_NOT_FOUND if no such engine is followed, or another negative code.
    #[pyo3(signature = (instance_id, tenant_id = String::from("default")))]
    #[pyo3(text_signature = "(self, instance_id, tenant_id='default')")]
    fn unregister_engine(&self, py: Python<'_>, instance_id: String, tenant_id: String) -> i32 {
        let msg = pb::UnregisterEngineRequest {
            instance_id,
            tenant_id,
        };
        match self.call(py, |mut c, t| async move {
            c.unregister_engine(request(msg, &t)).await
        }) {
            Ok(resp) => resp.ret,
            Err(code) => code,
        }
    }

    /// Stops consuming events for the subscription (instance_id, tenant_id, dp_rank).
    ///
    /// Returns OK, SERVICE_NOT_FOUND if the subscription does not exist, or another negative code.
    #[pyo3(signature = (instance_id, tenant_id = String::from("default"), dp_rank = 0))]
    #[pyo3(text_signature = "(self, instance_id, tenant_id='default', dp_rank=0)")]
    fn unregister(
        &self,
        py: Python<'_>,
        instance_id: String,
        tenant_id: String,
        dp_rank: i64,
    ) -> i32 {
        let msg = pb::UnregisterRequest {
            instance_id,
            tenant_id,
            dp_rank,
        };
        match self.call(py, |mut c, t| async move {
            c.unregister(request(msg, &t)).await
        }) {
            Ok(resp) => resp.ret,
            Err(code) => code,
        }
    }

    /// Returns a snapshot of indexed model contexts: {"ret", "context_count", "contexts"}.
    /// On failure ret is negative, context_count is 0 and contexts is [].
    fn get_global_view<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        match self.call(py, |mut c, t| async move {
            c.get_global_view(request(pb::GetGlobalViewRequest {}, &t))
                .await
        }) {
            Ok(resp) if resp.ret == OK => convert::global_view(py, OK, Some(resp)),
            Ok(resp) => convert::global_view(py, resp.ret, None),
            Err(code) => convert::global_view(py, code, None),
        }
    }

    /// Lists active publisher configurations: {"ret", "count", "services"}, each service with the
    /// export keys Endpoint, ReplayEndpoint, Type, ModelName, LoraName, TenantID, InstanceID,
    /// BlockSize, DPRank, CacheGroup and HashProfile. On failure ret is negative, count is 0 and
    /// services is [].
    fn list_services<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        match self.call(py, |mut c, t| async move {
            c.list_services(request(pb::ListServicesRequest {}, &t))
                .await
        }) {
            Ok(resp) if resp.ret == OK => convert::services(py, OK, Some(resp)),
            Ok(resp) => convert::services(py, resp.ret, None),
            Err(code) => convert::services(py, code, None),
        }
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    /// Calls close(); never suppresses an exception raised in the `with` body.
    #[pyo3(signature = (_exc_type = None, _exc_value = None, _traceback = None))]
    fn __exit__(
        &self,
        py: Python<'_>,
        _exc_type: Option<&Bound<'_, PyAny>>,
        _exc_value: Option<&Bound<'_, PyAny>>,
        _traceback: Option<&Bound<'_, PyAny>>,
    ) -> bool {
        self.close(py);
        false
    }

    fn __repr__(&self) -> String {
        match self.conn().as_ref() {
            Some(c) => format!("<ConductorClient connected to {}>", c.addr),
            None => "<ConductorClient (not connected)>".to_owned(),
        }
    }
}

#[pymodule]
mod _conductor {
    #[pymodule_export]
    use super::ConductorClient;

    #[pymodule_export]
    const OK: i32 = super::codes::OK;
    #[pymodule_export]
    const INTERNAL_ERROR: i32 = super::codes::INTERNAL_ERROR;
    #[pymodule_export]
    const INVALID_PARAMS: i32 = super::codes::INVALID_PARAMS;
    #[pymodule_export]
    const RPC_FAIL: i32 = super::codes::RPC_FAIL;
    #[pymodule_export]
    const RPC_TIMEOUT: i32 = super::codes::RPC_TIMEOUT;
    #[pymodule_export]
    const CONDUCTOR_UNAVAILABLE: i32 = super::codes::CONDUCTOR_UNAVAILABLE;
    #[pymodule_export]
    const SERVICE_NOT_FOUND: i32 = super::codes::SERVICE_NOT_FOUND;
    #[pymodule_export]
    const UNAUTHORIZED: i32 = super::codes::UNAUTHORIZED;
    #[pymodule_export]
    const HEALTH_OK: i32 = super::codes::HEALTH_OK;
    #[pymodule_export]
    const HEALTH_NOT_INITIALIZED: i32 = super::codes::HEALTH_NOT_INITIALIZED;
    #[pymodule_export]
    const HEALTH_UNREACHABLE: i32 = super::codes::HEALTH_UNREACHABLE;
}
