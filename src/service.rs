//! Wiring of the running service: the actix System on a multi-threaded tokio runtime, the
//! listeners, and the shutdown protocol.

use std::net::SocketAddr;

use tokio_util::sync::CancellationToken;

use crate::config::Config;

/// A start-up or shutdown failure of the service.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error("cannot listen for {what} on {addr}: {source}")]
    Bind { what: &'static str, addr: SocketAddr, source: std::io::Error },
    #[error("cannot start the runtime: {0}")]
    Runtime(std::io::Error),
    #[error("{0}")]
    Other(String),
}

/// Run the service until SIGINT or SIGTERM, then shut down cleanly.
pub fn run_until_signal(config: Config) -> Result<(), ServiceError> {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().map_err(ServiceError::Runtime)?;
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
    let http_addr = SocketAddr::new(config.bind_address, config.http_server_port);
    let rpc_addr = SocketAddr::new(config.bind_address, config.rpc_server_port);
    let http = tokio::net::TcpListener::bind(http_addr)
        .await
        .map_err(|source| ServiceError::Bind { what: "HTTP", addr: http_addr, source })?;
    let rpc = tokio::net::TcpListener::bind(rpc_addr)
        .await
        .map_err(|source| ServiceError::Bind { what: "gRPC", addr: rpc_addr, source })?;
    let http_local = http.local_addr().map_err(|e| ServiceError::Other(e.to_string()))?;
    let rpc_local = rpc.local_addr().map_err(|e| ServiceError::Other(e.to_string()))?;
    tracing::info!(http = %http_local, grpc = %rpc_local, "mooncake_conductor listening");
    shutdown.cancelled().await;
    tracing::info!("shutdown complete");
    Ok(())
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match (signal(SignalKind::interrupt()), signal(SignalKind::terminate())) {
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
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
