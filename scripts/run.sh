#!/usr/bin/env bash
# Set up a fresh machine and run the service. Without CONDUCTOR_CONFIG_PATH (and without
# ~/.mooncake/conductor_config.json) it uses the embedded default: HTTP 8080, gRPC 50052.
#
# The binary is optimised: the dev profile with this crate at opt-level 3 and without debug
# assertions or overflow checks. Only the workspace crates see these settings (Cargo.toml pins
# them for every dependency), so the dependencies, RocksDB included, are the very artefacts the
# test suite builds: after ./scripts/test.sh this compiles the crate again, never RocksDB.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/setup.sh
export CARGO_PROFILE_DEV_OPT_LEVEL=3 CARGO_PROFILE_DEV_DEBUG_ASSERTIONS=false
export CARGO_PROFILE_DEV_OVERFLOW_CHECKS=false
cargo build --locked --bins
exec "$CARGO_TARGET_DIR/debug/mooncake_conductor" "$@"
