"""Test doubles and helpers: a scripted gRPC peer, a silent TCP peer, a running Conductor, and a
vLLM-style ZMQ publisher with the vllm_v1 / sha256_cbor hash chain."""

import hashlib
import json
import os
import socket
import subprocess
import threading
import time
import urllib.request
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

# --------------------------------------------------------------------------------------------
# Minimal protobuf wire encoding (varints and length-delimited fields), enough to script the
# responses of a fake server and to read back what the client sent.


def varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # negative int32/int64 values travel as 10-byte two's complement varints
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def pb_int(field: int, value: int) -> bytes:
    return varint(field << 3) + varint(value)


def pb_bytes(field: int, value: Union[bytes, str]) -> bytes:
    data = value.encode() if isinstance(value, str) else value
    return varint((field << 3) | 2) + varint(len(data)) + data


def pb_map_entry(field: int, key: str, value: bytes) -> bytes:
    """One map<string, X> entry; `value` is the already-encoded field 2."""
    return pb_bytes(field, pb_bytes(1, key) + value)


def pb_decode(data: bytes) -> List[Tuple[int, Union[int, bytes]]]:
    """(field number, value) pairs in wire order; length-delimited values stay bytes."""
    out, i = [], 0
    while i < len(data):
        key, i = read_varint(data, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, i = read_varint(data, i)
        elif wire == 2:
            n, i = read_varint(data, i)
            value, i = data[i : i + n], i + n
        else:
            raise ValueError(f"unexpected wire type {wire}")
        out.append((field, value))
    return out


def read_varint(data: bytes, i: int) -> Tuple[int, int]:
    """The varint at `data[i:]`: its value and the index after it."""
    shift = result = 0
    while True:
        b = data[i]
        i += 1
        result |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return result, i


# --------------------------------------------------------------------------------------------
# Peers that are not a Conductor.


class _Peer:
    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.addr = f"127.0.0.1:{self.port}"
        self._conns: List[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self._conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            while conn.recv(65536):
                pass
        except OSError:
            return  # closed by close() while blocked in recv()

    def close(self) -> None:
        # shutdown() first: a bare close() would not wake the thread blocked in accept(), and the
        # kernel would keep accepting on the "closed" listener.
        self._closed = True
        for s in [self._listener] + self._conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class SilentPeer(_Peer):
    """Accepts TCP connections and never sends a byte (no HTTP/2, no gRPC)."""


Answer = Union[bytes, int, None]
"""A scripted answer: message bytes (grpc-status 0), an int (that grpc-status, no message), or
None (never answer)."""


class FakeConductor(_Peer):
    """Speaks just enough HTTP/2 to answer gRPC calls from a script, in arrival order.

    The first answer goes to setup()'s probe. Once the script is used up, `then` decides: "empty"
    answers every call with an empty message (a Conductor with nothing registered: every field
    default, ret 0), "silent" never answers again. `requests` collects the request messages.
    """

    PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

    def __init__(self, script: Sequence[Answer] = (b"",), then: str = "empty") -> None:
        self.script = list(script)
        self.then = then
        self.requests: List[bytes] = []
        self._lock = threading.Lock()
        super().__init__()

    @staticmethod
    def _frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
        return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload

    @staticmethod
    def _literal(name: str, value: str) -> bytes:
        # HPACK "literal header field without indexing, new name", no Huffman coding.
        return b"\x00" + bytes([len(name)]) + name.encode() + bytes([len(value)]) + value.encode()

    def _next_answer(self) -> Answer:
        with self._lock:
            if self.script:
                return self.script.pop(0)
            return b"" if self.then == "empty" else None

    def _answer(self, conn: socket.socket, stream: int, answer: Answer) -> None:
        headers = b"\x88" + self._literal("content-type", "application/grpc")  # :status 200
        if isinstance(answer, int):
            block = headers + self._literal("grpc-status", str(answer))
            conn.sendall(self._frame(0x1, 0x5, stream, block))  # trailers-only response
            return
        message = b"\x00" + len(answer).to_bytes(4, "big") + answer
        conn.sendall(
            self._frame(0x1, 0x4, stream, headers)
            + self._frame(0x0, 0x0, stream, message)
            + self._frame(0x1, 0x5, stream, self._literal("grpc-status", "0"))
        )

    def _serve(self, conn: socket.socket) -> None:
        conn.sendall(self._frame(0x4, 0, 0))  # server preface: empty SETTINGS
        buf, bodies = b"", {}  # type: bytes, Dict[int, bytes]
        try:
            while True:
                data = conn.recv(65536)
                if not data:
                    return
                buf += data
                if buf.startswith(self.PREFACE):
                    buf = buf[len(self.PREFACE) :]
                while len(buf) >= 9:
                    length = int.from_bytes(buf[:3], "big")
                    if len(buf) < 9 + length:
                        break
                    kind, flags = buf[3], buf[4]
                    stream = int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF
                    payload, buf = buf[9 : 9 + length], buf[9 + length :]
                    if kind == 0x4 and not flags & 0x1:
                        conn.sendall(self._frame(0x4, 0x1, 0))  # SETTINGS ACK
                    elif kind == 0x6 and not flags & 0x1:
                        conn.sendall(self._frame(0x6, 0x1, 0, payload))  # PING ACK
                    elif kind == 0x1:
                        bodies[stream] = b""
                    elif kind == 0x0 and stream in bodies:
                        bodies[stream] += payload
                        if flags & 0x1:  # END_STREAM: the request message is complete
                            self.requests.append(bodies.pop(stream)[5:])
                            answer = self._next_answer()
                            if answer is not None:
                                self._answer(conn, stream, answer)
        except OSError:
            return


# --------------------------------------------------------------------------------------------
# The real server.


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bound_ports(log: Path, start: int, proc: subprocess.Popen, timeout: float = 60.0) -> Tuple[int, int]:
    """The (http, grpc) ports a service started with port 0 logged after `start` in `log`
    ("sockets bound: http ADDR grpc ADDR", logged before recovery)."""
    marker = "sockets bound: http "
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(log, "rb") as f:
            f.seek(start)
            text = f.read().decode(errors="replace")
        # Whole lines only: the last one may still be being written.
        for line in text.split("\n")[:-1]:
            at = line.find(marker)
            words = line[at + len(marker):].split() if at >= 0 else []
            if len(words) >= 3 and words[1] == "grpc":
                return int(words[0].rsplit(":", 1)[1]), int(words[2].rsplit(":", 1)[1])
        if proc.poll() is not None:
            raise RuntimeError(
                f"mooncake_conductor exited with {proc.returncode} before binding its ports:\n"
                + text[-4000:]
            )
        time.sleep(0.02)
    raise RuntimeError(f"mooncake_conductor logged no bound ports within {timeout} s")


def make_certs(directory: Path) -> Dict[str, Path]:
    """A CA and a server certificate it signed for localhost and 127.0.0.1 (the `openssl`
    command): paths under "ca", "cert" and "key"."""
    directory.mkdir(parents=True, exist_ok=True)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)

    openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=test-ca",
            "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign")
    openssl("req", "-new", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost")
    (directory / "ext.cnf").write_text(
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n"
    )
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "server.pem", "-days", "2", "-extfile", "ext.cnf")
    return {"ca": directory / "ca.pem", "cert": directory / "server.pem", "key": directory / "server.key"}


def wait_for_port(port: int, proc: subprocess.Popen, log: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"mooncake_conductor exited with {proc.returncode} before listening:\n"
                + log.read_text(errors="replace")[-4000:]
            )
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"mooncake_conductor did not accept on port {port} within {timeout} s")


def wait_for_ready(
    http_port: int, proc: subprocess.Popen, log: Path, timeout: float = 60.0, tls_ca: Optional[Path] = None
) -> None:
    """Waits for HTTP /health to answer 200: the listeners answer while subscriptions are
    restored, and registration changes wait for that (and are refused after 10 s). With
    `tls_ca`, over HTTPS checked against that CA."""
    import ssl
    import urllib.error
    import urllib.request

    scheme, context = ("https", ssl.create_default_context(cafile=str(tls_ca))) if tls_ca else ("http", None)

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"mooncake_conductor exited with {proc.returncode} before it was ready:\n"
                + log.read_text(errors="replace")[-4000:]
            )
        try:
            url = f"{scheme}://127.0.0.1:{http_port}/health"
            with urllib.request.urlopen(url, timeout=1, context=context) as r:
                if r.status == 200:
                    return
        except (OSError, urllib.error.URLError):
            pass
        time.sleep(0.05)
    raise RuntimeError(f"mooncake_conductor was not ready within {timeout} s")


class ConductorProcess:
    """A mooncake_conductor on free loopback ports with a temporary config and data dir."""

    def __init__(
        self,
        binary: str,
        workdir: Path,
        args: Sequence[str] = (),
        extra_config: Optional[Dict[str, object]] = None,
        env: Optional[Dict[str, str]] = None,
        tls_ca: Optional[Path] = None,
    ) -> None:
        self._tls_ca = tls_ca
        data_dir = workdir / "data"
        data_dir.mkdir(parents=True, exist_ok=True)
        config = workdir / "conductor.json"
        # Port 0 at the first start: the service binds free ports itself and logs them, which
        # leaves no moment in which another process could take a port chosen here first.
        # Restarts keep those ports (clients hold the address), so they are written back.
        self._config_path = config
        self._config: Dict[str, object] = {
            "http_server_port": 0,
            "rpc_server_port": 0,
            "bind_address": "127.0.0.1",
            "kvevent_instance": {},
            "data_dir": str(data_dir),
            # The tests' engines serve on loopback (the default refuses loopback engine URLs).
            "allow_local_engine_addresses": True,
            **(extra_config or {}),
        }
        config.write_text(json.dumps(self._config))
        self.http_port = int(self._config["http_server_port"])
        self.rpc_port = int(self._config["rpc_server_port"])
        self.addr = f"127.0.0.1:{self.rpc_port}"
        self.log = workdir / "conductor.log"
        self._command = [binary, *args]
        # The service's token comes from `config` or `env` only, never from the test runner.
        inherited = {k: v for k, v in os.environ.items() if k != "CONDUCTOR_AUTH_TOKEN"}
        self._env = dict(inherited, CONDUCTOR_CONFIG_PATH=str(config), **(env or {}))
        self._spawn()

    def _spawn(self) -> None:
        with open(self.log, "ab") as out:
            start = out.tell()
            self.proc = subprocess.Popen(self._command, env=self._env, stdout=out, stderr=subprocess.STDOUT)
        try:
            if self.http_port == 0 or self.rpc_port == 0:
                self.http_port, self.rpc_port = bound_ports(self.log, start, self.proc)
                self.addr = f"127.0.0.1:{self.rpc_port}"
                self._config["http_server_port"] = self.http_port
                self._config["rpc_server_port"] = self.rpc_port
                self._config_path.write_text(json.dumps(self._config))
            wait_for_port(self.rpc_port, self.proc, self.log)
            # The servers answer while subscriptions are restored; registration changes wait
            # for that, so a test starts once /health says ready.
            wait_for_ready(self.http_port, self.proc, self.log, tls_ca=self._tls_ca)
        except Exception:
            self.stop()
            raise

    def restart(self) -> None:
        """Stop (SIGTERM) and start again on the same ports and data directory."""
        self.stop()
        self._spawn()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def wait_until(predicate, timeout: float = 10.0, interval: float = 0.05):
    """Polls `predicate` until it returns something truthy; returns that, or the last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)


# --------------------------------------------------------------------------------------------
# vLLM publisher side: the vllm_v1 sha256_cbor chain and the 3-frame ZMQ messages.

VLLM_CBOR_PROFILE = {
    "strategy": "vllm_v1",
    "algorithm": "sha256_cbor",
    "python_hash_seed": "0",
    "index_projection": "low64_be",
}


def cbor_root(seed: str) -> bytes:
    import cbor2

    return hashlib.sha256(cbor2.dumps(seed, canonical=True)).digest()


def vllm_block_hashes(
    tokens: Sequence[int], block_size: int, seed: str = "0", lora_name: str = "", cache_salt: str = ""
) -> List[int]:
    """Event hashes (low64_be of each full digest) of the complete blocks of `tokens`."""
    import cbor2

    parent = cbor_root(seed)
    out = []
    for i in range(len(tokens) // block_size):
        extras = ([lora_name] if lora_name else []) + ([cache_salt] if i == 0 and cache_salt else [])
        block = tuple(tokens[i * block_size : (i + 1) * block_size])
        payload = cbor2.dumps((parent, block, tuple(extras) if extras else None), canonical=True)
        parent = hashlib.sha256(payload).digest()
        out.append(int.from_bytes(parent[24:32], "big"))
    return out


class VllmPublisher:
    """A vLLM-style KV event publisher: a PUB socket that binds (the Conductor connects to it),
    and with `with_replay` a ROUTER that serves the replay protocol from a buffer of every batch,
    as vLLM's publisher thread does."""

    def __init__(self, with_replay: bool = False) -> None:
        import zmq

        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.PUB)
        port = self._sock.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = f"tcp://127.0.0.1:{port}"
        self._seq = 0
        self._buffer = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.replay_endpoint = ""
        self._replay_thread = None
        if with_replay:
            router = self._ctx.socket(zmq.ROUTER)
            port = router.bind_to_random_port("tcp://127.0.0.1")
            self.replay_endpoint = f"tcp://127.0.0.1:{port}"
            self._replay_thread = threading.Thread(target=self._serve_replay, args=(router,), daemon=True)
            self._replay_thread.start()

    def _serve_replay(self, router) -> None:
        # `[identity, b"", start_seq]` in; every buffered batch from start_seq on as
        # `[identity, b"", topic, seq, payload]`, then the end marker with seq -1.
        end = (-1).to_bytes(8, "big", signed=True)
        while not self._stop.is_set():
            if not router.poll(50):
                continue
            identity, _empty, start = router.recv_multipart()
            start = int.from_bytes(start, "big")
            with self._lock:
                batches = [(q, p) for q, p in self._buffer if q >= start]
            for seq, payload in batches:
                router.send_multipart([identity, b"", b"", seq.to_bytes(8, "big"), payload])
            router.send_multipart([identity, b"", b"", end, b""])
        router.close(linger=0)

    def block_stored(
        self,
        tokens: Sequence[int],
        block_size: int,
        medium: Optional[str] = "GPU",
        dp_rank: int = 0,
        lost: bool = False,
        **hash_args,
    ) -> None:
        """Publish one BlockStored batch (with `lost`, only into the replay buffer)."""
        import msgpack

        n = len(tokens) // block_size
        event = {
            "type": "BlockStored",
            "block_hashes": vllm_block_hashes(tokens, block_size, **hash_args),
            "parent_block_hash": None,
            "token_ids": list(tokens[: n * block_size]),
            "block_size": block_size,
            "lora_id": None,
            "medium": medium,
            "lora_name": hash_args.get("lora_name") or None,
        }
        payload = msgpack.packb([time.time(), [event], dp_rank])
        with self._lock:
            self._buffer.append((self._seq, payload))
        if not lost:
            self._sock.send_multipart([b"", self._seq.to_bytes(8, "big"), payload])
        self._seq += 1

    def close(self) -> None:
        self._stop.set()
        if self._replay_thread is not None:
            self._replay_thread.join()
        self._sock.close(linger=0)
        self._ctx.term()
