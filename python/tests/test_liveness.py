"""A pyzmq (libzmq) publisher behind a network path that freezes: the Conductor pings it (libzmq
answers PING with PONG by itself), notices the silence within the configured timeout, keeps the
publisher's blocks while it is away, and on its return checks continuity through the replay
socket, which fills in the batch lost with the frozen connection."""

import json
import socket
import threading
import time
import urllib.request

import pytest

from support import VLLM_CBOR_PROFILE, ConductorProcess, VllmPublisher, wait_until

pytestmark = pytest.mark.server

HEARTBEAT_MS, TIMEOUT_MS = 200, 1000
SERVICE = "vllm-0|default|0"


class FreezingRelay:
    """Forwards TCP both ways between its clients and `target_port`; frozen, it stops forwarding
    in both directions and keeps every socket open (no FIN, no RST), as a hung path does."""

    def __init__(self, target_port: int) -> None:
        self._target = ("127.0.0.1", target_port)
        self._flowing = threading.Event()
        self._flowing.set()
        self._closed = False
        self._sockets = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"tcp://127.0.0.1:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
                upstream = socket.create_connection(self._target)
            except OSError:
                continue
            self._sockets += [client, upstream]
            threading.Thread(target=self._pipe, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                self._flowing.wait()
                data = src.recv(65536)
                if not data:
                    dst.shutdown(socket.SHUT_WR)
                    return
                self._flowing.wait()
                dst.sendall(data)
        except OSError:
            return

    def freeze(self) -> None:
        self._flowing.clear()

    def resume(self) -> None:
        self._flowing.set()

    def close(self) -> None:
        self._closed = True
        self._flowing.set()
        for s in [self._listener] + self._sockets:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()


def http_json(port: int, path: str, body=None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=data, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=5) as r:
        return json.loads(r.read())


def status(conductor) -> dict:
    rows = http_json(conductor.http_port, "/services/status")["services"]
    return next((r for r in rows if r["service"] == SERVICE), {})


@pytest.fixture
def setup(conductor_bin, tmp_path):
    conductor = ConductorProcess(
        conductor_bin,
        tmp_path,
        extra_config={
            "publisher_heartbeat_ms": HEARTBEAT_MS,
            "publisher_timeout_ms": TIMEOUT_MS,
            "publisher_unreachable_grace_ms": 60_000,
        },
    )
    publisher = VllmPublisher(with_replay=True)
    relay = FreezingRelay(int(publisher.endpoint.rsplit(":", 1)[1]))
    yield conductor, publisher, relay
    relay.close()
    publisher.close()
    conductor.stop()


def test_a_frozen_libzmq_publisher_is_noticed_and_healed_through_replay(setup):
    conductor, publisher, relay = setup
    registration = {
        "instance_id": "vllm-0",
        "endpoint": relay.endpoint,
        "replay_endpoint": publisher.replay_endpoint,
        "type": "vLLM",
        "modelname": "m",
        "block_size": 16,
        "dp_rank": 0,
        "hash_profile": dict(VLLM_CBOR_PROFILE),
    }
    http_json(conductor.http_port, "/register", registration)
    # Until the subscription is up, batches may be lost on the live stream; the replay heals them.
    prompt = list(range(64))
    published = 0
    while status(conductor).get("last_seq") is None:
        publisher.block_stored(prompt, 16)
        published += 1
        assert published < 500, status(conductor)
        time.sleep(0.02)
    assert wait_until(lambda: status(conductor).get("last_seq") == published - 1, timeout=10), status(conductor)

    # libzmq answers our PINGs: a connection of several timeouts' length is never given up.
    watched_until = time.monotonic() + 3 * TIMEOUT_MS / 1000
    while time.monotonic() < watched_until:
        row = status(conductor)
        assert row["connected"] and row["timeouts"] == 0, row
        time.sleep(0.05)

    relay.freeze()
    frozen_at = time.monotonic()
    publisher.block_stored(list(range(100, 164)), 16)  # lost with the frozen connection
    published += 1
    assert wait_until(lambda: status(conductor).get("timeouts") == 1, timeout=10), status(conductor)
    noticed_after = time.monotonic() - frozen_at
    assert noticed_after < TIMEOUT_MS / 1000 + 2, noticed_after
    row = status(conductor)
    assert not row["connected"] and row["sources_dropped"] == 0, row

    relay.resume()
    back = wait_until(
        lambda: (lambda r: r["connected"] and r["last_seq"] == published - 1 and r["replays_ok"] >= 1)(
            status(conductor)
        ),
        timeout=10,
    )
    assert back, status(conductor)
    row = status(conductor)
    assert (row["timeouts"], row["sources_dropped"], row["restarts"]) == (1, 0, 0), row
