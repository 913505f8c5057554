"""The recorded engine scenarios (tests/fixtures/events/scenarios/, produced by vLLM 0.33's and
SGLang 0.5.23's own caches) replayed into the real server: registered and queried through
``ConductorClient``, each fixture's frames published on a real PUB socket with the recorded seqs,
and every answer compared with what the engine's own cache state says (``<name>.expect.json``)."""

import base64
import json
import urllib.request
from pathlib import Path

import pytest

from mooncake.conductor import OK
from support import free_port, wait_until

pytestmark = pytest.mark.server

SCENARIOS = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "events" / "scenarios"
TIERS = ("device", "cpu_local", "cpu_share", "disk")


def load(path: Path):
    """A fixture (docs/fixtures.md, version 1) and its queries and expected answers."""
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    header, frames = lines[0], lines[1:]
    assert (header["format"], header["version"]) == ("mooncake-conductor-fixture", 1), path.name
    assert header["frames"] == len(frames) > 0, f"{path.name}: truncated or empty"
    batches = [(f["seq"], base64.b64decode(f["topic"]), base64.b64decode(f["payload"])) for f in frames]
    stem = path.name[: -len(".jsonl")]
    queries = json.loads((SCENARIOS / f"{stem}.queries.json").read_text())
    expected = json.loads((SCENARIOS / f"{stem}.expect.json").read_text())
    assert queries and len(queries) == len(expected), f"{path.name}: an answer per query"
    assert [e["query"] for e in expected] == list(range(len(queries)))
    return header, batches, queries, [e["instances"] for e in expected]


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

    def send(self, seq, topic, payload):
        self.sock.send_multipart([topic, seq.to_bytes(8, "big"), payload])

    def close(self):
        self.sock.close(linger=0)
        self._ctx.term()


def counts(row):
    return {t: row[t] for t in TIERS}


def answer(hits):
    """A query result's hits in ``check``'s shape: the four counts and each rank's."""
    return {
        instance: dict(counts(row), rank_matches={r: counts(t) for r, t in row["rank_matches"].items()})
        for instance, row in hits.items()
    }


@pytest.mark.parametrize("path", sorted(SCENARIOS.glob("*.jsonl")), ids=lambda p: p.stem)
def test_recorded_scenario_answers_like_the_engine(client, conductor, path):
    header, batches, queries, expected = load(path)
    instance = header["instance_id"]
    publisher = Publisher()
    try:
        config = {
            "instance_id": instance,
            "endpoint": publisher.endpoint,
            "publisher_type": header["publisher_type"],
            "model_name": header["model_name"],
            "lora_name": header.get("lora_name", ""),
            "block_size": header["block_size"],
            "dp_rank": header["dp_rank"],
            "hash_profile": dict(header["hash_profile"]),
        }
        assert client.register(config) == OK
        service = f"{instance}|default|{header['dp_rank']}"

        # The SUB joins asynchronously and PUB drops what it sends before that: resend the first
        # batch (the Conductor ignores a repeated seq) until it is applied.
        first_seq = batches[0][0]

        def first_applied():
            publisher.send(*batches[0])
            status = service_status(conductor, service)
            return status is not None and status["last_seq"] == first_seq

        assert wait_until(first_applied, timeout=15, interval=0.1), f"{path.stem}: first batch never applied"
        for batch in batches[1:]:
            publisher.send(*batch)
        last_seq = batches[-1][0]
        assert last_seq == header["last_seq"]
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
    for i, (q, want) in enumerate(zip(queries, expected)):
        result = client.query(
            header["model_name"],
            lora_name=q["lora_name"] or "",
            block_size=header["block_size"],
            token_ids=q["token_ids"],
            cache_salt=q["cache_salt"] or "",
            instance_filter=q["instance"],
        )
        assert result["ret"] == OK, result
        row = result["hits"].get(instance)
        if row is None:
            wrong.append(f"query {i}: no row for {instance}, engine says {want}")
            continue
        got = answer(result["hits"])
        if got != want or row["longest_matched"] != row["disk"]:
            wrong.append(
                f"query {i} ({q['why']}): got {got} (longest_matched {row['longest_matched']}), engine says {want}"
            )
    assert not wrong, f"{path.stem}:\n" + "\n".join(wrong)


def test_every_scenario_is_collected():
    # The parametrized test above would silently shrink if the fixtures went missing.
    assert len(list(SCENARIOS.glob("*.jsonl"))) >= 6
