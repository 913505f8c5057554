//! Wiring of the running service: the actix System on a multi-threaded tokio runtime, the
//! registry and contexts, static registrations, the gRPC and HTTP servers (on the gateway's
//! own worker threads), and the shutdown protocol (stop accepting, finish in-flight requests,
//! stop subscriptions, exit 0).

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use actix::Actor;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::durability::checkpoint::Checkpointer;
use crate::durability::recovery::RestoredRegistration;
use crate::gateway::grpc::GrpcService;
use crate::gateway::ops::Ops;
use crate::gateway::pb;
use crate::gateway::readiness::Readiness;
use crate::gateway::registration::{HTTP_NAMES, HTTP_REGISTER_SCHEMA};
use crate::gateway::request::{Limits, RootSeed};
use crate::gateway::workers::{Routers, Workers};
use crate::registry::shared::etcd::EtcdRegistry;
use crate::registry::shared::marker;
use crate::registry::shared::sync::SyncState;
use crate::registry::{
    ArbiterPool, ContextDirectory, Origin, Register, Registry, ShutdownAll, SubscriptionDirectory,
};
use crate::replica::attempts::Outcome;
use crate::storage::health::StorageHealth;

/// A start-up failure of the service.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error("cannot listen for {what} on {addr}: {source}")]
    Bind {
        what: &'static str,
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot start the runtime: {0}")]
    Runtime(std::io::Error),
    #[error("{0}")]
    Storage(#[from] crate::storage::StorageError),
    #[error("{0}")]
    Other(String),
}

/// Run the service until SIGINT or SIGTERM, then shut down cleanly.
pub fn run_until_signal(config: Config) -> Result<(), ServiceError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(ServiceError::Runtime)?;
    let system = actix_rt::System::with_tokio_rt(move || runtime);
    system.block_on(async move {
        let shutdown = CancellationToken::new();
        let signal_token = shutdown.clone();
        tokio::spawn(async move {
            wait_for_signal().await;
            signal_token.cancel();
        });
        run(config, shutdown).await
    })
}

/// Run the service until `shutdown` is cancelled. Must be called inside an actix System.
pub async fn run(config: Config, shutdown: CancellationToken) -> Result<(), ServiceError> {
    // The PEM files are read once, here: a bad one stops the start, and a restart reloads them.
    let server_tls = match &config.tls {
        Some(files) => {
            Some(crate::gateway::tls::ServerTls::load(files).map_err(ServiceError::Other)?)
        }
        None => None,
    };
    let peer_tls = match &config.replica.bootstrap_tls {
        Some(files) => Some(files.client_config().map_err(ServiceError::Other)?),
        None => None,
    };
    let http_addr = SocketAddr::new(config.bind_address, config.http_server_port);
    let rpc_addr = SocketAddr::new(config.bind_address, config.rpc_server_port);
    let http = tokio::net::TcpListener::bind(http_addr)
        .await
        .map_err(|source| ServiceError::Bind {
            what: "HTTP",
            addr: http_addr,
            source,
        })?;
    let rpc = tokio::net::TcpListener::bind(rpc_addr)
        .await
        .map_err(|source| ServiceError::Bind {
            what: "gRPC",
            addr: rpc_addr,
            source,
        })?;
    let http_local = http
        .local_addr()
        .map_err(|e| ServiceError::Other(e.to_string()))?;
    let rpc_local = rpc
        .local_addr()
        .map_err(|e| ServiceError::Other(e.to_string()))?;
    // Before recovery, so that whoever started the service with port 0 learns its ports while
    // it recovers (connections wait in the listen backlog meanwhile). The addresses are in the
    // message text, which the log format never styles.
    tracing::info!("sockets bound: http {http_local} grpc {rpc_local}");

    // Recovery runs before the servers accept anything (connections wait in the listen backlog).
    let mut loaded = crate::durability::load(&config.data_dir, config.on_corrupt_data())?;
    // Before anything recovered is used: a bootstrap that did not complete left a partial state.
    let bootstrap_peer =
        crate::replica::plan(&config, loaded.store.as_ref(), &mut loaded.recovered)?;
    let replica = Arc::new(crate::replica::progress::Progress::new(
        crate::replica::progress::replica_id(config.replica.replica_id.as_deref()),
    ));
    let threads = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .clamp(1, 8);
    let arbiters = ArbiterPool::new(threads);
    let budget = Arc::new(config.index_budget());
    tracing::info!(
        "index memory budget: max_index_bytes {} (0: none), max_context_blocks {} (0: none)",
        budget.max_index_bytes(),
        budget.max_context_blocks()
    );
    let contexts = ContextDirectory::new(arbiters.clone()).with_budget(budget);
    // Every context started on this store makes its keys as the store's were made.
    contexts.set_tuning(loaded.recovered.tuning);
    let mut persisted = HashSet::new();
    for index in loaded.recovered.contexts {
        persisted.insert(index.key().clone());
        contexts.insert(contexts.start(index));
    }
    let subscriptions = SubscriptionDirectory::default();
    let shared = match &config.shared_registry {
        Some(etcd) => Some(EtcdRegistry::new(etcd.clone()).map_err(ServiceError::Other)?),
        None => None,
    };
    let mut registry = Registry::new(
        contexts.clone(),
        subscriptions.clone(),
        config.subscription_settings(),
        loaded.store.clone(),
    )
    .with_policy(config.registration_policy());
    if let Some(shared) = &shared {
        registry = registry.with_shared(shared.clone());
    }
    let registry = registry.start();
    let mut registrations = loaded.recovered.registrations;
    let mut source_records = loaded.recovered.sources;
    let dropped_at_recovery = loaded.recovered.dropped;
    let readiness = Arc::new(Readiness::starting(format!(
        "restoring {} subscriptions",
        registrations.len()
    )));
    let auth = crate::gateway::auth::Auth::new(config.auth_tokens.clone(), config.auth_reads);
    if auth.enabled() {
        tracing::info!(
            tokens = config.auth_tokens.len(),
            reads = config.auth_reads,
            "registration changes need the service token"
        );
    }
    let storage_health = Arc::new(StorageHealth::default());
    let export_counts = Arc::new(crate::replica::serve::ExportCounts::default());
    // Incomplete once the bootstrap failed for good: `/health` says degraded until caught up.
    let completeness = Arc::new(crate::replica::complete::Completeness::default());
    let connection_limits = config.connection_limits();
    let connections =
        crate::gateway::connections::Connections::new(connection_limits.max_connections);
    let mut ops = Ops::new(registry.clone(), contexts.clone(), readiness.clone(), auth)
        .with_max_query_tokens(config.max_query_tokens)
        .with_shared(shared.clone())
        .with_storage_health(storage_health.clone())
        .with_metrics_section(replica.clone())
        .with_metrics_section(completeness.clone())
        .with_degraded_source(completeness.clone())
        .with_metrics_section(export_counts.clone())
        .with_metrics_section(connections.clone());
    // Engines registered by URL register their ranks through these same operations.
    let fleet = crate::engines::fleet::Fleet::new(
        ops.clone(),
        config.registration_policy(),
        config.engines.settings,
        crate::engines::records::Records::new(loaded.store.clone(), shared.clone()),
    );
    ops.set_engines(Arc::new(crate::engines::FleetControl(fleet.clone())));
    if let Some(tls) = &server_tls {
        ops = ops.with_metrics_section(tls.counters.clone());
        tracing::info!("both servers speak TLS only");
    }

    // The servers answer before any subscription starts: whatever a publisher does at start,
    // `/health` says what the service is doing and an operator can look at `/services/status`.
    let routers = {
        let limit = config.rpc_message_limit_bytes as usize;
        let service = crate::gateway::pb_server::conductor_server::ConductorServer::new(
            GrpcService::new(ops.clone()),
        )
        .max_decoding_message_size(limit)
        .max_encoding_message_size(limit);
        let reflection = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
            .build_v1()
            .map_err(|e| ServiceError::Other(format!("gRPC reflection: {e}")))?;
        let snapshots = crate::replica::serve::SnapshotService::new(
            ops.clone(),
            loaded.store.clone(),
            contexts.clone(),
            subscriptions.clone(),
            replica.replica_id().to_owned(),
        )
        .guarded(
            !config.auth_tokens.is_empty(),
            config.replica.snapshot_export_open,
        )
        .counting(export_counts);
        let snapshots = crate::gateway::pb_server::replica_server::ReplicaServer::new(snapshots)
            .max_encoding_message_size(crate::replica::format::MAX_CHUNK_BYTES);
        // One budget of large bodies in flight for both transports.
        let budget = crate::gateway::body_budget::BodyBudget::new(config.http_inflight_body_bytes);
        let routes = tonic::service::Routes::new(service)
            .add_service(snapshots)
            .add_service(reflection);
        Routers {
            http: crate::gateway::http::router(
                ops.clone(),
                crate::gateway::http::BodyLimits {
                    body_bytes: config.http_body_limit_bytes as usize,
                    max_query_tokens: config.max_query_tokens,
                },
                budget.clone(),
            ),
            grpc: crate::gateway::bounds::GrpcBounds::new(
                routes,
                ops.clone(),
                budget,
                crate::gateway::bounds::MessageLimits::new(config.max_query_tokens, limit),
            ),
        }
    };
    tracing::info!(
        max_connections = connection_limits.max_connections,
        idle_timeout_ms = connection_limits.idle_timeout.as_millis() as u64,
        "connection limits"
    );
    let gateway = Workers::start(
        threads,
        (http, rpc),
        routers,
        connection_limits,
        connections,
        server_tls,
        shutdown.clone(),
    )
    .map_err(|e| ServiceError::Other(format!("gateway workers: {e}")))?;
    tracing::info!(http = %http_local, grpc = %rpc_local, replica_id = %replica.replica_id(), "mooncake_conductor listening");

    // A new replica loads a peer's snapshot while its servers already say so on `/health`;
    // it is not ready before it has loaded one and caught up, or given up and caught up empty.
    let (mut bootstrapped, mut started_empty) = (false, false);
    if let Some(peer) = bootstrap_peer {
        let attempts = crate::replica::attempts::Attempts {
            peer,
            token: config.auth_tokens.first(),
            tls: peer_tls.as_ref(),
            limit: config.replica.bootstrap_attempts,
            bounds: crate::replica::receive::Limits::of(&config),
        };
        match attempts
            .run(&loaded.store, &readiness, &replica, &shutdown)
            .await
        {
            Outcome::Loaded(recovered) => {
                // The peer's tuning, which its snapshot brought into the store.
                contexts.set_tuning(recovered.tuning);
                for index in recovered.contexts {
                    persisted.insert(index.key().clone());
                    contexts.insert(contexts.start(index));
                }
                registrations = recovered.registrations;
                source_records = recovered.sources;
                bootstrapped = true;
            }
            Outcome::StartEmpty { attempts, error } => {
                completeness.started_empty(peer, attempts, &error);
                started_empty = true;
            }
            Outcome::Stopped => {
                tracing::info!(
                    "shutting down during the bootstrap; the next start bootstraps again"
                );
                gateway.join().await;
                arbiters.stop();
                return Ok(());
            }
        }
    }
    let restored: Vec<_> = registrations.iter().map(|r| r.config.clone()).collect();
    for (source, why) in &dropped_at_recovery {
        tracing::warn!(service = %source, reason = why, "no consistent position for this source: its blocks were dropped and it rebuilds from its publisher's stream start");
    }

    // Each subscription is its own actor and socket tasks: one that fails to register is logged
    // and skipped, one whose publisher misbehaves only affects itself.
    for RestoredRegistration { config, restored } in registrations {
        let key = config.subscription_key();
        match registry
            .send(Register {
                config,
                names: crate::gateway::registration::PYTHON_NAMES,
                restored: Some(restored),
                origin: Origin::Restore,
            })
            .await
        {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                tracing::error!(service = %key, "recovered registration not restarted: {}", e.message)
            }
            Err(e) => tracing::error!(service = %key, "registry unavailable: {e}"),
        }
    }
    // Registrations shared through etcd: what etcd holds wins over what this replica restored,
    // unless etcd lost them (then nothing is removed; `registry::shared::reset`).
    let sync_stop = CancellationToken::new();
    // Set once etcd's first listing is applied: a bootstrapping replica waits for it.
    let (listed, listed_rx) = tokio::sync::watch::channel(false);
    let sync = match (&shared, &config.shared_registry) {
        (Some(shared), Some(etcd)) => {
            tracing::info!(endpoints = ?etcd.endpoints, prefix = %etcd.prefix, "registrations shared through etcd");
            // A store that never synchronised with this prefix brings its own registrations
            // to an etcd that holds none (a replica switched to etcd; see `registry::shared`).
            let store = loaded.store.clone();
            let seed = if marker::synced_with(store.as_ref(), &etcd.prefix) {
                Vec::new()
            } else {
                restored.clone()
            };
            // The history it followed tells an etcd that lost the fleet's registrations from
            // a fleet that removed them (see `registry::shared::reset`).
            let history = marker::history(store.as_ref(), &etcd.prefix);
            let state = SyncState::new(&etcd.prefix, restored)
                .with_seed(seed)
                .with_history(history);
            Some(tokio::spawn(shared.clone().run(
                state,
                registry.clone(),
                sync_stop.clone(),
                store,
                listed,
            )))
        }
        _ => None,
    };
    readiness.set_starting("starting static registrations");
    start_static_registrations(&config, &ops).await;
    let checkpoint_stop = CancellationToken::new();
    let checkpointer = Checkpointer::new(
        loaded.store.clone(),
        contexts.clone(),
        subscriptions,
        persisted,
        source_records,
    )
    .with_health(storage_health);
    let interval = Duration::from_millis(config.checkpoint_interval_ms);
    let checkpoints = if bootstrapped {
        tokio::spawn(crate::replica::checkpoint_after_bootstrap(
            checkpointer,
            registry.clone(),
            loaded.store.clone(),
            interval,
            checkpoint_stop.clone(),
        ))
    } else {
        tokio::spawn(checkpointer.run(interval, checkpoint_stop.clone()))
    };
    let listed = config.shared_registry.is_some().then_some(listed_rx);
    if started_empty {
        // After the static registrations: those the start brings are running (with etcd, the
        // watch waits for its first listing too), so none is missed by a look that finds the
        // others caught up.
        tokio::spawn(completeness.watch(registry.clone(), listed.clone(), shutdown.clone()));
    }
    if bootstrapped || started_empty {
        crate::replica::catch_up(&registry, &readiness, &replica, listed).await;
    }
    readiness.set_ready();
    tracing::info!("ready");
    let engines_stop = CancellationToken::new();
    follow_engines(&config, fleet, engines_stop.clone()).await;

    shutdown.cancelled().await;
    engines_stop.cancel();
    tracing::info!("shutting down: no new requests, finishing in-flight ones");
    gateway.join().await;
    sync_stop.cancel();
    if let Some(sync) = sync {
        let _ = sync.await;
    }
    // One round while the subscriptions still run records each source's position; the last
    // one, after every subscription stopped, holds all they applied (its contexts are ahead of
    // those positions, which a restart replays from: docs/durability.md).
    checkpoint_stop.cancel();
    let checkpointer = checkpoints.await.ok();
    let mut checkpointer = match checkpointer {
        Some(mut checkpointer) => {
            checkpointer.checkpoint().await;
            Some(checkpointer)
        }
        None => None,
    };
    let _ = registry.send(ShutdownAll).await;
    if let Some(checkpointer) = checkpointer.as_mut() {
        let report = checkpointer.checkpoint().await;
        tracing::info!(
            contexts = report.contexts,
            pairs = report.pairs,
            failed = report.failed,
            "final checkpoint"
        );
    }
    arbiters.stop();
    tracing::info!("shutdown complete");
    Ok(())
}

/// Follow the configuration's engines and the engines registered before, and resolve
/// `engines_dns`, until `stop` (docs/engine-discovery.md).
async fn follow_engines(
    config: &Config,
    fleet: Arc<crate::engines::fleet::Fleet>,
    stop: CancellationToken,
) {
    use crate::engines::spec::Origin;
    fleet
        .set_origin(Origin::Config, config.engines.entries.clone())
        .await;
    match &config.engines.dns {
        Some(dns) => {
            tokio::spawn(crate::engines::dns::follow(
                fleet.clone(),
                dns.clone(),
                stop.clone(),
            ));
        }
        // The configuration is the source of truth for what it declares: the addresses a name
        // it no longer has resolved to (kept in the store) are followed no more, their ranks
        // unregistered now.
        None => fleet.set_origin(Origin::Dns, Vec::new()).await,
    }
    tokio::spawn(fleet.clone().run_loads(stop.clone()));
    tokio::spawn(fleet.run(stop));
}

/// Start every `kvevent_instance` entry; a bad entry is logged by its name and skipped.
async fn start_static_registrations(config: &Config, ops: &Ops) {
    let (mut ok, mut failed) = (0, 0);
    for (name, entry) in &config.kvevent_instance {
        let mut entry = entry.clone();
        // The reference's rule: an entry without instance_id is named by its stream key.
        entry
            .entry("instance_id")
            .or_insert_with(|| serde_json::Value::String(name.clone()));
        let seed = RootSeed {
            schema: HTTP_REGISTER_SCHEMA,
            limits: Limits {
                max_tokens: config.max_query_tokens,
            },
        };
        let result = async {
            let fields = crate::gateway::request::from_json_map(entry, seed)?;
            let input = crate::gateway::http_register::registration_from_http(fields)?;
            ops.register_at_start(input, HTTP_NAMES).await
        }
        .await;
        match result {
            Ok(_) => ok += 1,
            Err(e) => {
                failed += 1;
                tracing::error!(entry = %name, field = ?e.field, "static registration skipped: {}", e.message);
            }
        }
    }
    if ok + failed > 0 {
        tracing::info!(success = ok, failed, "static registrations started");
    }
}

/// SIGINT or SIGTERM (Ctrl-C where those cannot be installed).
pub async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) {
        (Ok(mut int), Ok(mut term)) => {
            tokio::select! {
                _ = int.recv() => tracing::info!("SIGINT received"),
                _ = term.recv() => tracing::info!("SIGTERM received"),
            }
        }
        _ => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
