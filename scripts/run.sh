#!/usr/bin/env bash
# Set up a fresh machine and run the service. Without CONDUCTOR_CONFIG_PATH (and without
# ~/.mooncake/conductor_config.json) it uses the embedded default: HTTP 8080, gRPC 50052.
#
# The binary is `cargo build --release`: every crate optimised, no debug assertions or overflow
# checks anywhere, RocksDB's C++ optimised, no test hooks (docs/build.md). The test suite builds
# the same profile, so after ./scripts/test.sh this compiles the crate again, never RocksDB.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/setup.sh
cargo build --release --locked --bins
exec "$CARGO_TARGET_DIR/release/mooncake_conductor" "$@"
