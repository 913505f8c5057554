#!/usr/bin/env bash
# The whole test suite: formatting, lints, Rust unit and integration tests (real sockets, real
# binary), and the Python client's tests against the real binary.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/setup.sh

cargo fmt --all -- --check
# Modules depend one way (docs/ARCHITECTURE.md): any import cycle fails the run, in well under a second.
python3 scripts/check-deps.py --self-test
python3 scripts/check-deps.py src
cargo clippy --locked --all-targets -p mooncake-conductor -p mooncake-conductor-codes -- -D warnings
cargo clippy --locked --all-targets -p mooncake-conductor-python -- -D warnings
cargo build --locked --bins
# Property tests draw fresh cases on every developer run; CI pins the seed so that a red run is
# reproducible (export PROPTEST_RNG_SEED yourself to replay it). New failures land in
# proptest-regressions/, which is committed.
PROPTEST_RNG_SEED="${PROPTEST_RNG_SEED:-20261130}" cargo test --locked -p mooncake-conductor

.venv/bin/pip install -q --disable-pip-version-check ./python
CONDUCTOR_BIN="$CARGO_TARGET_DIR/debug/mooncake_conductor" .venv/bin/python -m pytest -q python/tests
