//! `mooncake_conductor`: load the configuration, run the service until SIGINT/SIGTERM, exit 0.
//! Operational commands on the configured data directory (with the service stopped):
//! `mooncake_conductor dump [FILTER]`, `mooncake_conductor verify`, `mooncake_conductor compact`,
//! `mooncake_conductor unregister INSTANCE [--tenant T] [--dp-rank R]`.
//! Fixture tools, which need no configuration: `mooncake_conductor record|play|check ...`
//! (`docs/fixtures.md`).

use std::io::IsTerminal;
use std::process::ExitCode;

use mooncake_conductor::config::{Config, LOG_LEVEL_ENV, LogLevel};
use mooncake_conductor::storage::KvStore;
use mooncake_conductor::storage::rocks::RocksStore;
use mooncake_conductor::{admin, service};

const USAGE: &str = "usage: mooncake_conductor [dump [FILTER] | verify | compact | unregister INSTANCE [--tenant T] [--dp-rank R] | record ... | play FILE ... | check FILE ...]";

fn main() -> ExitCode {
    let level = LogLevel::parse(std::env::var(LOG_LEVEL_ENV).ok().as_deref());
    tracing_subscriber::fmt()
        .with_env_filter(level.clone().unwrap_or(LogLevel::Info).as_filter())
        .with_writer(std::io::stderr)
        // Colour codes only for a person at a terminal: a log file or journal stays plain text.
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    if let Err(warning) = level {
        tracing::warn!("{warning}");
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    // The fixture tools talk to publishers and files only: no configuration, no data directory.
    if let Some(command @ ("record" | "play" | "check")) = args.first().map(String::as_str) {
        return match mooncake_conductor::fixture::run_command(command, &args[1..]) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                tracing::error!("{e}");
                ExitCode::FAILURE
            }
        };
    }
    let (config, origin) = match Config::load() {
        Ok(loaded) => loaded,
        Err(e) => {
            tracing::error!("{e}");
            return ExitCode::FAILURE;
        }
    };
    tracing::info!(%origin, "configuration loaded");
    let result = match args.first().map(String::as_str) {
        None => service::run_until_signal(config).map_err(|e| e.to_string()),
        Some(command @ ("dump" | "verify" | "compact")) => {
            admin_command(command, args.get(1), &config)
        }
        Some("unregister") => admin::parse_unregister_args(&args[1..])
            .map_err(|e| format!("{e}\n{USAGE}"))
            .and_then(|key| unregister_command(&key, &config)),
        Some(_) => Err(USAGE.to_owned()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            ExitCode::FAILURE
        }
    }
}

fn admin_command(command: &str, arg: Option<&String>, config: &Config) -> Result<(), String> {
    let store = RocksStore::open(&config.data_dir)
        .map_err(|e| format!("{e} (is the service still running on it?)"))?;
    match command {
        "dump" => {
            let filter = arg.map_or("", String::as_str);
            let n = admin::dump(&store, filter, &mut std::io::stdout().lock())
                .map_err(|e| e.to_string())?;
            tracing::info!(contexts = n, "dumped");
        }
        "verify" => {
            let r = admin::verify(&store).map_err(|e| e.to_string())?;
            println!(
                "{{\"schema_version\":{},\"registrations\":{},\"contexts\":{},\"pairs\":{},\"disk_bytes\":{}}}",
                r.schema_version,
                r.registrations,
                r.contexts,
                r.pairs,
                store.disk_bytes()
            );
        }
        _ => {
            let before = store.disk_bytes();
            store.compact().map_err(|e| e.to_string())?;
            tracing::info!(before, after = store.disk_bytes(), "compacted");
        }
    }
    Ok(())
}

fn unregister_command(
    key: &mooncake_conductor::model::SubscriptionKey,
    config: &Config,
) -> Result<(), String> {
    let store = RocksStore::open(&config.data_dir)
        .map_err(|e| format!("{e} (is the service still running on it?)"))?;
    if admin::unregister(&store, key).map_err(|e| e.to_string())? {
        println!(
            "{{\"unregistered\":{}}}",
            serde_json::json!(key.to_string())
        );
        tracing::info!(service = %key, "registration removed; its blocks are dropped at the next start");
        return Ok(());
    }
    let known = admin::registered_keys(&store).map_err(|e| e.to_string())?;
    Err(format!(
        "no registration {key} in {} (registered: {})",
        config.data_dir.display(),
        if known.is_empty() {
            "none".to_owned()
        } else {
            known.join(", ")
        }
    ))
}
