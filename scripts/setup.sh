#!/usr/bin/env bash
# Idempotent set-up for a fresh machine (Debian 12, Rust toolchain, Python 3.11, gcc):
# system packages, the Rust dependency cache, and a Python venv with the client package.
# Sourced by `.ci/run` and by the README's commands.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# libclang: bindgen for librocksdb-sys. Our gRPC code generation uses protox (pure Rust), but the
# etcd client's build script runs protoc, with the well-known types of libprotobuf-dev.
# etcd-server: the replica tests start a real etcd on loopback.
pkgs=(libclang-dev protobuf-compiler libprotobuf-dev etcd-server)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if ((${#missing[@]})); then
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The build directory lives outside the checkout so that a fresh clone on the same machine reuses
# the bundled RocksDB build (about 25 minutes of C++ on two cores) instead of redoing it.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/conductor-target}"
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
cargo fetch --locked >/dev/null

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/pip install -q --disable-pip-version-check --no-warn-conflicts 'maturin>=1.16,<2' 'pytest>=8' 'pyzmq>=26' 'cbor2>=5' 'msgpack>=1'
