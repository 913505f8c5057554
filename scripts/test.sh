#!/usr/bin/env bash
# The whole test suite: formatting, lints, Rust unit and integration tests (real sockets, real
# binary), and the Python client's tests against the real binary.
#
# Everything builds in the release profile, so that the dependencies (RocksDB's C++ included) are
# the very artefacts `scripts/run.sh` ships: on a fresh machine the two README commands compile
# each dependency once. The overrides below reach the workspace crates only (Cargo.toml pins every
# dependency): the code under test keeps its debug assertions and overflow checks, builds quickly
# at opt-level 0, and keeps line tables for backtraces (docs/build.md).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/setup.sh
# Only the tests need these: g++ and libssl-dev build SGLang's own page hash (C++).
for p in g++ libssl-dev; do
  dpkg -s "$p" >/dev/null 2>&1 || {
    [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
    ${sudo_cmd:-} apt-get update -qq
    DEBIAN_FRONTEND=noninteractive ${sudo_cmd:-} apt-get install -y -qq --no-install-recommends g++ libssl-dev
    break
  }
done
# The engines' own code for the engine-registration tests (python/tests/engine_apps.py): vLLM's
# and SGLang's wheels without their dependencies (no torch, no GPU; 880 MB installed, so only
# once), and what the modules the tests load import.
if ! .venv/bin/pip show -q vllm sglang >/dev/null 2>&1; then
  .venv/bin/pip install -q --disable-pip-version-check --no-warn-conflicts --no-deps 'vllm==0.33.0' 'sglang==0.5.23'
fi
.venv/bin/pip install -q --disable-pip-version-check --no-warn-conflicts 'fastapi==0.136.3' 'uvicorn==0.55.0' \
  'msgspec==0.23.0' 'pydantic==2.14.4' 'psutil==7.2.2' 'numpy==2.4.6' 'pybind11==3.1.0'

cargo fmt --all -- --check
# Modules depend one way (docs/ARCHITECTURE.md): any import cycle fails the run, in well under a second.
python3 scripts/check-deps.py --self-test
python3 scripts/check-deps.py src

(
  export CARGO_PROFILE_RELEASE_OPT_LEVEL=0 CARGO_PROFILE_RELEASE_DEBUG=line-tables-only
  export CARGO_PROFILE_RELEASE_DEBUG_ASSERTIONS=true CARGO_PROFILE_RELEASE_OVERFLOW_CHECKS=true
  cargo clippy --release --locked --all-targets -p mooncake-conductor -p mooncake-conductor-codes -p mooncake-conductor-loom -- -D warnings
  cargo clippy --release --locked --all-targets -p mooncake-conductor-python -- -D warnings
  # Property tests draw fresh cases on every developer run; CI pins the seed so that a red run is
  # reproducible (export PROPTEST_RNG_SEED yourself to replay it). New failures land in
  # proptest-regressions/, which is committed.
  PROPTEST_RNG_SEED="${PROPTEST_RNG_SEED:-20261130}" cargo test --release --locked -p mooncake-conductor
  # The loom model of the block table's lock-free reads (loom-model/): seconds.
  cargo test --release --locked -p mooncake-conductor-loom
)

# The Python tests run against the binary users run (scripts/run.sh's build: no test hooks).
cargo build --release --locked --bins
.venv/bin/pip install -q --disable-pip-version-check --no-warn-conflicts ./python
CONDUCTOR_BIN="$CARGO_TARGET_DIR/release/mooncake_conductor" .venv/bin/python -m pytest -q python/tests
