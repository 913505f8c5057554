//! Engines registered by their URL (docs/engine-discovery.md): the Conductor reads each
//! engine's own description of its DP ranks' KV-event sources, registers one subscription per
//! rank through the same path as `register()` (policy, caps, auth, etcd), and keeps them in
//! step with the engine on an interval.
//!
//! Layout: [`address`] the engine's URL and the endpoints rewritten to its host; [`describe`]
//! the engines' description formats; [`fetch`] one bounded HTTP read; [`read`] a description
//! by engine kind; [`spec`] a validated engine registration and the ranks a description asks
//! for; [`records`] engines registered by request, kept across restarts; [`fleet`] the engines
//! followed and how each is brought in step; [`load`] the engines' load figures; [`dns`] a
//! fleet from a name's addresses.

pub mod address;
pub mod describe;
pub mod dns;
pub mod fetch;
pub mod fleet;
pub mod load;
pub mod read;
pub mod records;
pub mod runner;
pub mod schedule;
pub mod spec;

use std::time::Duration;

use fetch::FetchLimits;

/// How often each engine's description is read again.
pub const DEFAULT_REFRESH_MS: u64 = 10_000;
/// How often each engine's load is read: queues change within seconds.
pub const DEFAULT_LOAD_REFRESH_MS: u64 = 1_000;
/// An engine whose description cannot be read keeps its ranks this long.
pub const DEFAULT_UNREADABLE_GRACE_MS: u64 = 60_000;
/// One read (connect, answer, body) of an engine route at most.
pub const DEFAULT_READ_TIMEOUT_MS: u64 = 2_000;
/// SGLang's `/server_info` carries every server argument: tens of KB; 1 MiB is far above.
pub const DEFAULT_MAX_DESCRIPTION_BYTES: u64 = 1 << 20;
/// Data-parallel ranks of one engine: real deployments have up to a few dozen.
pub const DEFAULT_MAX_RANKS_PER_ENGINE: u64 = 256;
/// Engines followed at once.
pub const DEFAULT_MAX_ENGINES: u64 = 4096;

/// The engine keys of the configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineSettings {
    pub refresh: Duration,
    pub load_refresh: Duration,
    pub unreadable_grace: Duration,
    pub fetch: FetchLimits,
    pub max_ranks_per_engine: usize,
    pub max_engines: usize,
}

impl Default for EngineSettings {
    fn default() -> Self {
        EngineSettings {
            refresh: Duration::from_millis(DEFAULT_REFRESH_MS),
            load_refresh: Duration::from_millis(DEFAULT_LOAD_REFRESH_MS),
            unreadable_grace: Duration::from_millis(DEFAULT_UNREADABLE_GRACE_MS),
            fetch: FetchLimits {
                deadline: Duration::from_millis(DEFAULT_READ_TIMEOUT_MS),
                max_body_bytes: DEFAULT_MAX_DESCRIPTION_BYTES as usize,
                allow_local: false,
            },
            max_ranks_per_engine: DEFAULT_MAX_RANKS_PER_ENGINE as usize,
            max_engines: DEFAULT_MAX_ENGINES as usize,
        }
    }
}

/// The engine operations as the gateway calls them.
pub struct FleetControl(pub std::sync::Arc<fleet::Fleet>);

impl crate::gateway::engines_api::EngineControl for FleetControl {
    fn register(
        &self,
        request: crate::gateway::engines_api::EngineRequest,
    ) -> futures::future::BoxFuture<
        'static,
        Result<crate::gateway::engines_api::EngineReply, crate::error::OpError>,
    > {
        let fleet = self.0.clone();
        Box::pin(async move {
            let spec = spec::EngineSpec::from_request(request, "type", spec::Origin::Request)?;
            fleet.add(spec).await
        })
    }

    fn unregister(
        &self,
        instance_id: String,
        tenant_id: String,
    ) -> futures::future::BoxFuture<'static, Result<usize, crate::error::OpError>> {
        let fleet = self.0.clone();
        Box::pin(async move { fleet.remove(&tenant_id, &instance_id).await })
    }

    fn list(&self) -> Vec<crate::gateway::engines_api::EngineStatus> {
        self.0.list()
    }

    fn load(
        &self,
        tenant_id: &str,
        instance_id: &str,
    ) -> Option<crate::gateway::engines_api::LoadReport> {
        self.0.load(tenant_id, instance_id)
    }

    fn render_metrics(&self, w: &mut String) {
        use std::fmt::Write;
        let engines = self.0.list();
        let _ = writeln!(
            w,
            "# HELP conductor_engine_discovery_errors_total Engine descriptions that could not be read or registered.\n# TYPE conductor_engine_discovery_errors_total counter\nconductor_engine_discovery_errors_total {}",
            self.0.discovery_errors()
        );
        let _ = writeln!(
            w,
            "# HELP conductor_engine_ranks Ranks per engine: found in its description, and registered.\n# TYPE conductor_engine_ranks gauge"
        );
        for e in &engines {
            for (kind, n) in [("found", e.ranks_found), ("registered", e.ranks_registered)] {
                let _ = writeln!(
                    w,
                    "conductor_engine_ranks{{instance_id=\"{}\",tenant_id=\"{}\",kind=\"{kind}\"}} {n}",
                    crate::metrics::esc(&e.instance_id),
                    crate::metrics::esc(&e.tenant_id),
                );
            }
        }
    }
}
