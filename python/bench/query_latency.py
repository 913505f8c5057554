"""Latency of the Python client's ``ConductorClient.query()`` next to a Rust gRPC client's, for a
2k-token prompt against the same server state.

The server is ``$CONDUCTOR_BIN``: the ``mooncake_conductor`` binary, or the load tool
(``benches/load.rs``) whose ``--mode serve`` runs the same service without the RocksDB build; the
binary ignores its arguments. The Rust figures come from ``$RUST_QUERY_BIN`` (default
``$CONDUCTOR_BIN``) run with ``--mode rust-query-latency``, which the load tool provides.

The script registers ``--instances`` vLLM publishers through the Python client, publishes over
real ZMQ PUB sockets prefixes of varying length of one shared prompt (the load tool's prompt),
waits until a query sees all of them, then alternates rounds of sequential Python and Rust calls.
The server runs on free loopback ports and is stopped at the end.

Needs the built extension plus pyzmq, msgpack and cbor2 (the test extras).
"""

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from mooncake.conductor import OK, ConductorClient
from support import VLLM_CBOR_PROFILE, ConductorProcess, VllmPublisher

MODEL = "load-model"
BLOCK_SIZE = 16


def prompt(n: int) -> list:
    """The load tool's shared prompt (same formula)."""
    return [(i * 7919 + 17) % 32000 for i in range(n)]


def percentile(sorted_us: list, p: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    k = max(1, min(len(sorted_us), math.ceil(p * len(sorted_us))))
    return sorted_us[k - 1]


def summary(samples_ns: list) -> dict:
    us = sorted(s / 1000 for s in samples_ns)
    return {
        "calls": len(us),
        "p50_us": percentile(us, 0.50),
        "p90_us": percentile(us, 0.90),
        "p99_us": percentile(us, 0.99),
        "max_us": us[-1],
        "mean_us": statistics.fmean(us),
    }


def populate(client: ConductorClient, instances: int, tokens: list) -> list:
    """Register one publisher per instance; instance i holds (i+1)/instances of the prompt."""
    total = len(tokens) // BLOCK_SIZE
    publishers, expected = [], {}
    for i in range(instances):
        pub = VllmPublisher()
        name = f"py-{i}"
        config = {
            "instance_id": name,
            "endpoint": pub.endpoint,
            "publisher_type": "vLLM",
            "model_name": MODEL,
            "block_size": BLOCK_SIZE,
            "dp_rank": 0,
            "hash_profile": VLLM_CBOR_PROFILE,
        }
        assert client.register(config) == OK, f"register {name}"
        publishers.append((name, pub))
        expected[name] = max(1, total * (i + 1) // instances) * BLOCK_SIZE
    deadline = time.monotonic() + 30
    while True:
        # A PUB drops what it sends before the subscriber joined: publish until it is visible.
        hits = client.query(MODEL, block_size=BLOCK_SIZE, token_ids=tokens)["hits"]
        missing = [(n, p) for n, p in publishers if hits.get(n, {}).get("device") != expected[n]]
        if not missing:
            return publishers
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(missing)} instances never showed their blocks")
        for name, pub in missing:
            pub.block_stored(tokens[: expected[name]], BLOCK_SIZE)
        time.sleep(0.05)


def python_round(client: ConductorClient, tokens: list, calls: int, instances: int) -> dict:
    samples = []
    for _ in range(calls):
        began = time.perf_counter_ns()
        r = client.query(MODEL, block_size=BLOCK_SIZE, token_ids=tokens)
        samples.append(time.perf_counter_ns() - began)
        assert r["ret"] == OK and len(r["hits"]) == instances, r["ret"]
    return summary(samples)


def rust_round(binary: str, rpc_port: int, calls: int, prompt_len: int) -> dict:
    args = [binary, "--mode", "rust-query-latency", "--rpc-port", str(rpc_port)]
    args += ["--calls", str(calls), "--model", MODEL, "--prompt-len", str(prompt_len)]
    out = subprocess.run(args, check=True, capture_output=True, text=True, timeout=300).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--instances", type=int, default=8)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--prompt-len", type=int, default=2048)
    args = parser.parse_args()
    binary = os.environ.get("CONDUCTOR_BIN")
    if not binary:
        sys.exit("set CONDUCTOR_BIN to the mooncake_conductor binary or the built load tool")
    rust_bin = os.environ.get("RUST_QUERY_BIN", binary)
    tokens = prompt(args.prompt_len)
    with tempfile.TemporaryDirectory() as workdir:
        # `--serve-secs` bounds the load tool's lifetime even if this script is killed.
        server = ConductorProcess(binary, Path(workdir), args=["--mode", "serve", "--serve-secs", "900"])
        publishers = []
        try:
            client = ConductorClient()
            assert client.setup(f"127.0.0.1:{server.rpc_port}") == OK
            publishers = populate(client, args.instances, tokens)
            for _ in range(min(200, args.calls)):  # warm-up: connection, allocator, caches
                client.query(MODEL, block_size=BLOCK_SIZE, token_ids=tokens)
            print(
                f"{args.instances} instances, {args.prompt_len}-token prompt, {args.calls} sequential calls per round"
            )
            fields = ("p50_us", "p90_us", "p99_us", "max_us", "mean_us")
            print(f"{'round':<6}{'client':<8}" + "".join(f"{f:>10}" for f in fields))
            ratios = []
            for n in range(args.rounds):
                py = python_round(client, tokens, args.calls, args.instances)
                rs = rust_round(rust_bin, server.rpc_port, args.calls, args.prompt_len)
                for name, s in (("python", py), ("rust", rs)):
                    print(f"{n:<6}{name:<8}" + "".join(f"{s[f]:>10.1f}" for f in fields))
                ratios.append((py["p50_us"] / rs["p50_us"], py["p99_us"] / rs["p99_us"]))
            for n, (p50, p99) in enumerate(ratios):
                print(f"round {n}: python/rust p50 {p50:.2f}x, p99 {p99:.2f}x")
            client.close()
        finally:
            for _, pub in publishers:
                pub.close()
            server.stop()


if __name__ == "__main__":
    main()
