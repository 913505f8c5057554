#!/usr/bin/env bash
# Set up a fresh machine and run the service. Without CONDUCTOR_CONFIG_PATH (and without
# ~/.mooncake/conductor_config.json) it uses the embedded default: HTTP 8080, gRPC 50052.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/setup.sh
cargo build --locked --bins
exec "$CARGO_TARGET_DIR/debug/mooncake_conductor" "$@"
