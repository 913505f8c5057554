//! `mooncake_conductor`: load the configuration, run the service until SIGINT/SIGTERM, exit 0.

use std::process::ExitCode;

use mooncake_conductor::config::{Config, LOG_LEVEL_ENV, LogLevel};
use mooncake_conductor::service;

fn main() -> ExitCode {
    let level = LogLevel::parse(std::env::var(LOG_LEVEL_ENV).ok().as_deref());
    tracing_subscriber::fmt()
        .with_env_filter(level.clone().unwrap_or(LogLevel::Info).as_filter())
        .with_writer(std::io::stderr)
        .init();
    if let Err(warning) = level {
        tracing::warn!("{warning}");
    }
    let (config, origin) = match Config::load() {
        Ok(loaded) => loaded,
        Err(e) => {
            tracing::error!("{e}");
            return ExitCode::FAILURE;
        }
    };
    tracing::info!(%origin, "configuration loaded");
    match service::run_until_signal(config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            ExitCode::FAILURE
        }
    }
}
