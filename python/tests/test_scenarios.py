"""The recorded engine scenarios (tests/fixtures/events/scenarios/, produced by vLLM 0.33's and
SGLang 0.5.23's own caches) replayed into the real server: registered and queried through
``ConductorClient``, published on a real PUB socket with the recorded seqs, and every answer
compared with what the engine's own cache state says."""

import json
import urllib.request
from pathlib import Path

import pytest

from mooncake.conductor import OK
from support import free_port, wait_until

pytestmark = pytest.mark.server

SCENARIOS = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "events" / "scenarios"
INSTANCE = "engine-0"
TIERS = ("device", "cpu_local", "cpu_share", "disk")


def load(path: Path):
    header, batches, queries = None, [], []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        entry = json.loads(line)
        if entry["kind"] == "scenario":
            header = entry
        elif entry["kind"] == "batch":
            batches.append((entry["seq"], bytes.fromhex(entry["payload_hex"])))
        elif entry["kind"] == "query":
            queries.append(entry)
        else:
            raise ValueError(f"{path.name}: unknown line kind {entry['kind']!r}")
    assert header and batches and queries, f"{path.name}: header, batches and queries"
    return header, batches, queries


def service_status(conductor, service):
    with urllib.request.urlopen(f"http://127.0.0.1:{conductor.http_port}/services/status", timeout=5) as r:
        status = json.load(r)
    return next((s for s in status["services"] if s["service"] == service), None)


class Publisher:
    """An engine's PUB socket (bound; the Conductor connects), sending recorded frames."""

    def __init__(self):
        import zmq

        self._ctx = zmq.Context()
        self.sock = self._ctx.socket(zmq.PUB)
        self.endpoint = f"tcp://127.0.0.1:{self.sock.bind_to_random_port('tcp://127.0.0.1')}"

    def send(self, seq, payload):
        self.sock.send_multipart([b"", seq.to_bytes(8, "big"), payload])

    def close(self):
        self.sock.close(linger=0)
        self._ctx.term()


def row_counts(row):
    return [row[t] for t in TIERS]


@pytest.mark.parametrize("path", sorted(SCENARIOS.glob("*.jsonl")), ids=lambda p: p.stem)
def test_recorded_scenario_answers_like_the_engine(client, conductor, path):
    header, batches, queries = load(path)
    reg = header["registration"]
    publisher = Publisher()
    try:
        config = {
            "instance_id": INSTANCE,
            "endpoint": publisher.endpoint,
            "publisher_type": reg["publisher_type"],
            "model_name": reg["model_name"],
            "lora_name": reg["lora_name"] or "",
            "block_size": reg["block_size"],
            "dp_rank": reg["dp_rank"],
            "hash_profile": dict(reg["hash_profile"]),
        }
        assert client.register(config) == OK
        service = f"{INSTANCE}|default|{reg['dp_rank']}"

        # The SUB joins asynchronously and PUB drops what it sends before that: resend the first
        # batch (the Conductor ignores a repeated seq) until it is applied.
        first_seq, first = batches[0]

        def first_applied():
            publisher.send(first_seq, first)
            status = service_status(conductor, service)
            return status is not None and status["last_seq"] == first_seq

        assert wait_until(first_applied, timeout=15, interval=0.1), f"{path.stem}: first batch never applied"
        for seq, payload in batches[1:]:
            publisher.send(seq, payload)
        last_seq = batches[-1][0]
        status = wait_until(
            lambda: (s := service_status(conductor, service)) and s["last_seq"] == last_seq and s, timeout=10
        )
        assert status, f"{path.stem}: batch {last_seq} never applied"
        assert status["invalid_events"] == 0, status
        # That seq was received and handed to the context, which applies it from its mailbox; a
        # registration in the same context answers only after a round trip through that
        # mailbox. The other instance never shows up: the queries filter on ours.
        barrier = dict(config, instance_id="barrier", endpoint=f"tcp://127.0.0.1:{free_port()}")
        assert client.register(barrier) == OK
    finally:
        publisher.close()

    wrong = []
    for i, q in enumerate(queries):
        result = client.query(
            reg["model_name"],
            lora_name=q["lora_name"] or "",
            block_size=reg["block_size"],
            token_ids=q["token_ids"],
            cache_salt=q["cache_salt"] or "",
            instance_filter=INSTANCE,
        )
        assert result["ret"] == OK, result
        want = q["expect"]
        row = result["hits"].get(INSTANCE)
        if row is None:
            wrong.append(f"query {i}: no row for {INSTANCE}, engine says {want}")
            continue
        got_ranks = {r: row_counts(t) for r, t in row["rank_matches"].items()}
        want_ranks = {r: row_counts(t) for r, t in want["rank_matches"].items()}
        if row_counts(row) != row_counts(want) or got_ranks != want_ranks or row["longest_matched"] != row["disk"]:
            wrong.append(
                f"query {i} ({q['why']}): got {row_counts(row)} ranks {got_ranks}, "
                f"engine says {row_counts(want)} ranks {want_ranks}"
            )
    assert not wrong, f"{path.stem}:\n" + "\n".join(wrong)


def test_every_scenario_is_collected():
    # The parametrized test above would silently shrink if the fixtures went missing.
    assert len(list(SCENARIOS.glob("*.jsonl"))) >= 6
