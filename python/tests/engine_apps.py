"""vLLM 0.33.0 and SGLang 0.5.23 engines without a GPU, for the register-by-URL tests.

Each app serves the engine's own description routes over HTTP (uvicorn, 127.0.0.1, port 0) and
runs the engine's own ZmqEventPublisher per DP rank, fed by the engine's own prefix cache (vLLM's
KVCacheManager/BlockPool, SGLang's RadixCache): what the Conductor reads and receives is what a
real engine sends. Modules load from the wheels (``pip install --no-deps``) through the loaders
and stubs of ``tests/fixtures/events/record_scenarios.py``; added here:

* vLLM, for real: ``config/utils.py`` and ``config/kv_events.py`` (the recorder stubs
  KVEventsConfig; the description must be the real pydantic dataclass), ``utils/__init__.py``
  (random_uuid), the routers of ``entrypoints/serve/instrumentator/basic.py`` and
  ``entrypoints/openai/models/api_router.py``, ``entrypoints/serve/engine/protocol.py``.
  Stubbed: ``engine.protocol``, ``entrypoints.serve.tokenize.serving`` and
  ``entrypoints.openai.models.serving`` (names the routers only annotate with), ``torch.nn``.
* SGLang, for real: ``srt/utils/network.py`` (describe_local_source parses with it),
  ``api/v1/api_types.py`` (KvEventSource), ``srt/entrypoints/v1_loads.py`` (its router),
  ``srt/managers/load_snapshot.py``. Its page hash is its own C++ extension, compiled once per
  source and interpreter as SGLang compiles it (g++, pybind11, OpenSSL headers) into a cache
  directory (ENGINE_APPS_CACHE, else the temp dir).

Deviations from a deployment, none in what is described or published: vLLM's publishers
advertise ``tcp://*:<port>`` but listen on loopback only (``_bind`` narrowed); SGLang's bind
``tcp://127.0.0.1:<port>`` with ``"bind": true`` (its own option), reported by
describe_local_source exactly as a ``*`` bind is. SGLang's ``/server_info`` has the keys the
Conductor reads, not every server argument. Every app stops by itself after ``lifetime`` s.
"""

import atexit
import contextlib
import functools
import hashlib
import importlib
import importlib.util
import json
import os
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import types
from array import array
from pathlib import Path
from typing import Dict, List, Optional, Sequence

EVENTS_DIR = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "events"
if str(EVENTS_DIR) not in sys.path:
    sys.path.insert(0, str(EVENTS_DIR))
import record_scenarios as rec  # noqa: E402  (installs its torch stub on import)

VLLM_HASH_ALGORITHM, HASH_SEED = "sha256_cbor", "0"
VLLM_PROFILE = {"strategy": "vllm_v1", "algorithm": VLLM_HASH_ALGORITHM,
                "python_hash_seed": HASH_SEED, "index_projection": "low64_be"}
SGLANG_PROFILE = {"strategy": "sglang", "algorithm": "sha256_raw",
                  "python_hash_seed": HASH_SEED, "index_projection": "first64_be"}
MAX_RANKS = 4  # ports reserved per app: ranks 0..3 (rank 2 is the one added at run time)


# --------------------------------------------------------------------------------------------
# Loading the engines' modules


def _load_file(name: str) -> types.ModuleType:
    """Load ``name`` from its source file in the wheel, replacing a stub of that name."""
    path = os.path.join(rec.SP, *name.split(".")) + ".py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _run_package_init(name: str) -> None:
    """Run a package's real ``__init__.py`` inside the recorder's stub package, keeping the
    submodules already loaded under it."""
    path = os.path.join(rec.SP, *name.split("."), "__init__.py")
    with open(path) as f:
        exec(compile(f.read(), path, "exec"), sys.modules[name].__dict__)


@functools.lru_cache(maxsize=None)
def vllm_modules() -> types.SimpleNamespace:
    """vLLM's cache, publisher, config and route modules, loaded once per process."""
    v = rec.load_vllm()
    _load_file("vllm.config.utils")
    v.kv_events.KVEventsConfig = _load_file("vllm.config.kv_events").KVEventsConfig
    sys.modules["torch"].nn = types.SimpleNamespace(Module=object)
    _run_package_init("vllm.utils")
    for pkg in ["vllm.engine", "vllm.entrypoints", "vllm.entrypoints.serve",
                "vllm.entrypoints.serve.instrumentator", "vllm.entrypoints.serve.engine",
                "vllm.entrypoints.serve.tokenize", "vllm.entrypoints.openai",
                "vllm.entrypoints.openai.models"]:
        rec._package(pkg)
    rec._stub("vllm.engine.protocol", EngineClient=object)
    rec._stub("vllm.entrypoints.serve.tokenize.serving", ServingTokenization=object)
    rec._stub("vllm.entrypoints.openai.models.serving", OpenAIServingModels=object)
    v.basic = importlib.import_module("vllm.entrypoints.serve.instrumentator.basic")
    v.models_api = importlib.import_module("vllm.entrypoints.openai.models.api_router")
    v.protocol = importlib.import_module("vllm.entrypoints.serve.engine.protocol")
    with _env("PYTHONHASHSEED", HASH_SEED):
        v.hash_fn = v.hashing.get_hash_fn_by_name(VLLM_HASH_ALGORITHM)
        v.kv_cache_utils.init_none_hash(v.hash_fn)

    class LoopbackZmqEventPublisher(v.kv_events.ZmqEventPublisher):
        """vLLM's publisher; a ``tcp://*`` bind listens on loopback, still advertised as ``*``."""

        @staticmethod
        def _bind(sock, endpoint):
            sock.bind(endpoint.replace("tcp://*:", "tcp://127.0.0.1:", 1))
            return endpoint

    v.Publisher = LoopbackZmqEventPublisher
    return v


@functools.lru_cache(maxsize=None)
def sglang_modules() -> types.SimpleNamespace:
    """SGLang's cache, publisher and route modules, loaded once per process."""
    s = rec.load_sglang(sglang_hash_extension())
    s.kv_events.NetworkAddress = _load_file("sglang.srt.utils.network").NetworkAddress
    for pkg in ["sglang.api", "sglang.api.v1", "sglang.srt.entrypoints", "sglang.srt.managers"]:
        rec._package(pkg)
    single_rank = types.SimpleNamespace(tp_size=1, pp_size=1, attn_dp_enabled=False)
    context = sys.modules["sglang.srt.runtime_context"]
    context.get_parallel, context.get_serving = (lambda: single_rank), (lambda: None)
    sys.modules["sglang.srt.utils"].get_device_name = lambda: None  # no accelerator here
    s.api_types = importlib.import_module("sglang.api.v1.api_types")
    s.load_snapshot = importlib.import_module("sglang.srt.managers.load_snapshot")
    s.v1_loads = importlib.import_module("sglang.srt.entrypoints.v1_loads")
    s.version = importlib.import_module("sglang.version").__version__
    return s


def sglang_hash_extension() -> str:
    """The directory holding SGLang's page hash (``hash_binding.cpp``) built as SGLang builds it
    (``-O3 -std=c++17 -DNDEBUG -lcrypto``); rebuilt only when the source or interpreter change."""
    source = Path(rec.SP) / "sglang" / "srt" / "mem_cache" / "cpp_utils" / "hash_binding.cpp"
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    key = hashlib.sha256(source.read_bytes() + (suffix + sys.version).encode()).hexdigest()[:16]
    root = os.environ.get("ENGINE_APPS_CACHE") or os.path.join(
        tempfile.gettempdir(), "mooncake-conductor-engine-apps")
    out = Path(root) / key
    target = out / f"hicache_hash_cpp{suffix}"
    if not target.exists():
        import pybind11

        out.mkdir(parents=True, exist_ok=True)
        partial = out / f"build-{os.getpid()}{suffix}"
        subprocess.run(["g++", "-O3", "-std=c++17", "-DNDEBUG", "-shared", "-fPIC",
                        "-DTORCH_EXTENSION_NAME=hicache_hash_cpp", "-w",
                        f"-I{pybind11.get_include()}", f"-I{sysconfig.get_paths()['include']}",
                        str(source), "-lcrypto", "-o", str(partial)],
                       check=True, capture_output=True, timeout=600)
        os.replace(partial, target)
    return str(out)


@contextlib.contextmanager
def _env(name: str, value: str):
    """Set one environment variable for a block (vLLM reads PYTHONHASHSEED when seeding)."""
    saved = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        os.environ.pop(name) if saved is None else os.environ.__setitem__(name, saved)


# --------------------------------------------------------------------------------------------
# Loopback plumbing


def port_run(count: int, attempts: int = 200) -> int:
    """The first of `count` consecutive free loopback ports: both engines give DP rank r the
    port base + r, so a rank's port cannot be left to the OS."""
    for _ in range(attempts):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + count <= 65535 and all(_port_free(base + i) for i in range(1, count)):
            return base
    raise RuntimeError(f"no {count} consecutive free loopback ports")


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


class HttpServer:
    """uvicorn serving `app` on 127.0.0.1 in a daemon thread, started and stopped in bounded
    time."""

    def __init__(self, app, timeout: float = 10.0) -> None:
        import uvicorn

        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False,
                                timeout_graceful_shutdown=1)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]},
                                       daemon=True, name=f"engine-http-{self.port}")
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the engine's HTTP server did not start")
            time.sleep(0.01)

    def stop(self, timeout: float = 5.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)


# --------------------------------------------------------------------------------------------
# The apps


class EngineApp:
    """What both engines share: ranks by DP rank, an HTTP server, failure switches, a lifetime.
    Subclasses add their routes (``_routes``) and make a rank (``_make_rank``)."""

    def __init__(self, model: str, ranks: Sequence[int], lifetime: float) -> None:
        from fastapi import FastAPI
        from fastapi.responses import JSONResponse

        self.model = model
        self.closed = threading.Event()  # set once close() has stopped everything
        self.base_port = port_run(2 * MAX_RANKS)
        self.replay_base_port = self.base_port + MAX_RANKS
        self.ranks: Dict[int, object] = {}
        self._lock = threading.Lock()
        self._failing: Optional[int] = None
        self.http: Optional[HttpServer] = None
        self.app = FastAPI()

        @self.app.middleware("http")
        async def failing(request, call_next):
            if self._failing is not None:
                return JSONResponse({"error": "engine unavailable"}, status_code=self._failing)
            return await call_next(request)

        self._routes()
        try:
            for rank in ranks:
                self.add_rank(rank)
            self.http = HttpServer(self.app)
        except BaseException:
            self.close()
            raise
        self.url = f"http://127.0.0.1:{self.http.port}"
        self._timer = threading.Timer(lifetime, self.close)
        self._timer.daemon = True
        self._timer.start()

    def add_rank(self, rank: int):
        """Start DP rank `rank` (its publisher on port base + rank); the description lists it."""
        assert 0 <= rank < MAX_RANKS, rank
        made = self._make_rank(rank)
        with self._lock:
            self.ranks[rank] = made
        return made

    def remove_rank(self, rank: int, stop_publisher: bool = True) -> None:
        """Drop `rank` from the description (a scale-down); its publisher stops too, as the
        rank's process would, unless `stop_publisher` is False."""
        with self._lock:
            gone = self.ranks.pop(rank)
        if stop_publisher:
            gone.stop()

    def _current(self) -> List[tuple]:
        with self._lock:
            return sorted(self.ranks.items())

    def fail_description(self, status: int = 500) -> None:
        """Answer every route with `status` while the publishers go on."""
        self._failing = status

    def serve_description(self) -> None:
        self._failing = None

    def stop_http(self) -> None:
        """Close the HTTP server (connections refused) while the publishers go on."""
        if self.http is not None:
            self.http.stop()

    def expected(self, tokens: Sequence[int]) -> Dict[str, int]:
        """Per rank (decimal text, as queries answer), the tokens of `tokens` its cache holds."""
        return {str(r): rank.cached_tokens(tokens) for r, rank in self._current()}

    def close(self) -> None:
        """Stop HTTP and every publisher (in parallel: each may wait up to 1 s to drain)."""
        timer = getattr(self, "_timer", None)
        if timer is not None and timer is not threading.current_thread():
            timer.cancel()
        self.stop_http()
        with self._lock:
            ranks, self.ranks = list(self.ranks.values()), {}
        stops = [threading.Thread(target=r.stop, daemon=True) for r in ranks]
        for t in stops:
            t.start()
        for t in stops:
            t.join(5)
        self.closed.set()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class VllmRank:
    """One vLLM DP rank: a KVCacheManager over vLLM's BlockPool, and vLLM's publisher."""

    def __init__(self, v, rank: int, endpoint: str, replay: str, block_size: int,
                 num_blocks: int = 512, max_model_len: int = 8192) -> None:
        ki = v.kv_cache_interface
        spec = ki.FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=8,
                                    dtype="float16")
        config = ki.KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                                  kv_cache_groups=[ki.KVCacheGroupSpec(["layer.0"], spec)])
        self.v, self.rank, self.block_size = v, rank, block_size
        self.manager = v.kv_cache_manager.KVCacheManager(
            config, max_model_len=max_model_len, scheduler_block_size=block_size,
            hash_block_size=block_size, enable_caching=True, enable_kv_cache_events=True)
        self.hasher = v.kv_cache_utils.get_request_block_hasher(block_size, v.hash_fn)
        self.publisher = v.Publisher(data_parallel_rank=rank, endpoint=endpoint,
                                     replay_endpoint=replay)
        self.count = 0

    def _request(self, tokens: Sequence[int]):
        self.count += 1
        return rec.Request(f"rank{self.rank}-req{self.count}", tokens, self.hasher)

    def store(self, tokens: Sequence[int]) -> None:
        """One request through prefix lookup, allocation (which caches its full blocks) and
        finish; its blocks stay in the prefix cache. The step's events are published."""
        r = self._request(tokens)
        blocks, hit, _ = self.manager.get_computed_blocks(r)
        assert self.manager.allocate_slots(r, r.num_tokens - hit, hit, blocks) is not None
        r.num_computed_tokens = r.num_tokens
        self.manager.free(r)
        self.step()

    def evict(self, tokens: Sequence[int], keep_tokens: int = 0) -> None:
        """Evict the cached blocks of `tokens` past the first `keep_tokens` (BlockRemoved)."""
        probe = rec.Request("probe", tokens, self.hasher)
        blocks, _, _ = self.manager.get_computed_blocks(probe, max_cache_hit_length=len(tokens))
        ids = blocks.get_block_ids()[0][keep_tokens // self.block_size:]
        self.manager.evict_blocks(set(ids))
        self.step()

    def clear(self) -> None:
        """reset_prefix_cache: AllBlocksCleared."""
        assert self.manager.reset_prefix_cache()
        self.step()

    def step(self) -> None:
        """The scheduler's publish: this step's events as one batch, none when there are none."""
        events = self.manager.take_events()
        if events:
            self.publisher.publish(self.v.kv_events.KVEventBatch(ts=time.time(), events=events))

    def stop(self) -> None:
        self.publisher.shutdown()

    def cached_tokens(self, tokens: Sequence[int]) -> int:
        """Tokens of `tokens` whose blocks this rank's pool holds (no last-token cap)."""
        probe = rec.Request("probe", tokens, self.hasher)
        return self.manager.get_computed_blocks(probe, max_cache_hit_length=len(tokens))[1]


class VllmEngineApp(EngineApp):
    """``vllm serve`` as the Conductor sees it: vLLM's own ``/kv_event_sources``, ``/load``,
    ``/version`` and ``/v1/models`` routes over DP ranks of VllmRank."""

    hash_profile = VLLM_PROFILE

    def __init__(self, model: str = "vllm-test-model", ranks: Sequence[int] = (0, 1),
                 block_size: int = 16, replay: bool = True, lifetime: float = 300.0) -> None:
        self.v = vllm_modules()
        self.block_size, self.replay = block_size, replay
        super().__init__(model, ranks, lifetime)

    def _routes(self) -> None:
        self.app.include_router(self.v.basic.router)
        self.app.include_router(self.v.models_api.router)
        self.app.state.engine_client = types.SimpleNamespace(
            get_kv_event_sources=self.kv_event_sources)
        self.app.state.server_load_metrics = 0
        self.app.state.openai_serving_models = types.SimpleNamespace(
            show_available_models=self._models)

    def _make_rank(self, rank: int) -> VllmRank:
        # Every rank gets the base endpoints; vLLM's publisher offsets the ports by its rank.
        replay = f"tcp://*:{self.replay_base_port}" if self.replay else None
        return VllmRank(self.v, rank, f"tcp://*:{self.base_port}", replay, self.block_size)

    def kv_event_sources(self) -> dict:
        """AsyncLLM.get_kv_event_sources: DP rank -> the publisher's resolved KVEventsConfig."""
        return {r: rank.publisher.get_publisher_config() for r, rank in self._current()}

    async def _models(self):
        """OpenAIModelRegistry.show_available_models: the base model, no adapters."""
        p = self.v.protocol
        return p.ModelList(data=[p.ModelCard(id=self.model, root=self.model, max_model_len=8192,
                                             permission=[p.ModelPermission()])])

    def set_load(self, server_load: int) -> None:
        self.app.state.server_load_metrics = server_load


class SglangRank:
    """One SGLang DP rank: a RadixCache with KV events, and SGLang's publisher as the scheduler
    makes it (EventPublisherFactory.create from the ``--kv-events-config`` text)."""

    def __init__(self, s, rank: int, kv_events_config: str, page_size: int) -> None:
        self.s, self.rank, self.page_size = s, rank, page_size
        self.tree = s.radix_cache.RadixCache.create_simulated(
            mock_allocator=rec.KvAllocator(), page_size=page_size, enable_kv_cache_events=True)
        self.publisher = s.kv_events.EventPublisherFactory.create(kv_events_config, rank)
        self.load = {"num_running_reqs": 0, "num_waiting_reqs": 0}
        self.step()  # the constructor's reset() queued AllBlocksCleared

    def _key(self, tokens: Sequence[int]):
        return self.s.radix_cache.RadixKey(array("q", tokens))

    def store(self, tokens: Sequence[int]) -> None:
        """Insert `tokens` into the tree (BlockStored per new page) and publish the step."""
        self.tree.insert(self.s.base_prefix_cache.InsertParams(key=self._key(tokens)))
        self.step()

    def evict(self, num_tokens: int) -> None:
        """Evict at least `num_tokens` from least recently used leaves (BlockRemoved)."""
        self.tree.evict(self.s.base_prefix_cache.EvictParams(num_tokens=num_tokens))
        self.step()

    def step(self) -> None:
        """SchedulerKvEventsPublisher.publish_kv_events: one batch when there are events."""
        events = self.tree.take_events()
        if events:
            self.publisher.publish(self.s.kv_events.KVEventBatch(ts=time.time(), events=events))

    def stop(self) -> None:
        """Shut the publisher down and drop its atexit hook, which would wait 1 s at exit for a
        queue nobody drains any more."""
        self.publisher.shutdown()
        atexit.unregister(self.publisher.shutdown)

    def cached_tokens(self, tokens: Sequence[int]) -> int:
        params = self.s.base_prefix_cache.MatchPrefixParams(key=self._key(tokens))
        return self.tree.match_prefix(params).device_prefix_len

    def snapshot(self, capacity: int):
        """This rank's LoadSnapshot, as its scheduler would write it."""
        used = self.tree.total_size()
        return self.s.load_snapshot.LoadSnapshot(
            timestamp=time.time(), dp_rank=self.rank, num_used_tokens=used,
            max_total_num_tokens=capacity, token_usage=used / capacity, **self.load)


class SglangEngineApp(EngineApp):
    """``sglang.launch_server`` as the Conductor sees it: ``/server_info`` with the scheduler's
    ``kv_event_sources`` and ``served_model_name``, SGLang's own ``/v1/loads`` router."""

    hash_profile = SGLANG_PROFILE
    capacity = 65536  # max_total_num_tokens reported by /v1/loads

    def __init__(self, model: str = "sglang-test-model", ranks: Sequence[int] = (0, 1),
                 page_size: int = 16, replay: bool = True, grpc_port: bool = True,
                 lifetime: float = 300.0) -> None:
        """`grpc_port`: SGLang puts ``kv_event_sources`` into the scheduler info (and so into
        ``/server_info``) only when the server runs its native gRPC server (``--grpc-port``);
        without it ``/server_info`` has only the ``kv_events`` descriptor."""
        self.s = sglang_modules()
        self.page_size, self.replay, self.grpc_port = page_size, replay, grpc_port
        super().__init__(model, ranks, lifetime)

    @property
    def kv_events_config(self) -> str:
        """The ``--kv-events-config`` text every rank's scheduler is given."""
        config = {"publisher": "zmq", "endpoint": f"tcp://127.0.0.1:{self.base_port}",
                  "bind": True}
        if self.replay:
            config["replay_endpoint"] = f"tcp://127.0.0.1:{self.replay_base_port}"
        return json.dumps(config)

    def _routes(self) -> None:
        self.app.get("/server_info")(self.server_info)
        self.app.include_router(self.s.v1_loads.router)
        manager = types.SimpleNamespace(get_loads=self._loads)
        self.app.dependency_overrides[self.s.v1_loads._get_tokenizer_manager] = lambda: manager

    def _make_rank(self, rank: int) -> SglangRank:
        return SglangRank(self.s, rank, self.kv_events_config, self.page_size)

    def kv_event_sources(self) -> List[dict]:
        """The scheduler's raw source dicts, sorted by rank, as ``/server_info`` sends them;
        each checked through SGLang's KvEventSource, with the keys it does not model
        (``replay_endpoint``) kept beside."""
        api = self.s.api_types
        out = []
        for _, rank in self._current():
            raw = rank.publisher.describe_local_source(self.page_size)
            fields = {k: raw[k] for k in api.KvEventSource.__struct_fields__ if k in raw}
            entry = api.encode_KvEventSource(api.KvEventSource(**fields))
            entry.update({k: v for k, v in raw.items() if k not in entry})
            out.append(entry)
        return out

    def kv_events_descriptor(self) -> dict:
        """describe_kv_events_publisher's ``kv_events`` entry (runtime_context.py)."""
        host, port = self.s.kv_events.parse_advertisable_tcp(
            json.loads(self.kv_events_config)["endpoint"])
        out = {"publisher": "zmq", "endpoint_host": host, "endpoint_port_base": port,
               "topic": "", "block_size": self.page_size, "dp_size": len(self._current())}
        if self.replay:
            out["replay_endpoint_port_base"] = self.replay_base_port
        return out

    async def server_info(self) -> dict:
        """The parts of http_server.server_info the Conductor reads, with their real keys."""
        info = {"model_path": self.model, "served_model_name": self.model,
                "page_size": self.page_size, "dp_size": len(self._current()),
                "kv_events_config": self.kv_events_config}
        if self.grpc_port:
            info["kv_event_sources"] = self.kv_event_sources()
        info.update({"kv_events": self.kv_events_descriptor(), "version": self.s.version,
                     "frontend": "python"})
        return info

    async def _loads(self, include=None, dp_rank=None):
        """TokenizerManager.get_loads: one LoadSnapshot per rank, or the one asked for."""
        return [rank.snapshot(self.capacity) for r, rank in self._current()
                if dp_rank is None or r == dp_rank]

    def set_load(self, rank: int, **fields) -> None:
        self.ranks[rank].load.update(fields)


def decoder(publisher_type: str):
    """The engine's own msgpack decoder for its KVEventBatch ("vLLM" or "SGLang")."""
    import msgspec

    modules = vllm_modules() if publisher_type == "vLLM" else sglang_modules()
    return msgspec.msgpack.Decoder(modules.kv_events.KVEventBatch)
