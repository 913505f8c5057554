"""Shapes of the dictionaries exchanged with :class:`mooncake.conductor.ConductorClient`.

These are ``TypedDict`` declarations for type checkers and readers; at run time the client
accepts and returns plain ``dict`` objects.
"""

from typing import Dict, List, Optional, Set, Tuple, TypedDict, Union


class TierCounts(TypedDict):
    """Cumulative prefix token counts of one DP rank: device <= cpu_local <= cpu_share <= disk."""

    device: int
    cpu_local: int
    cpu_share: int
    disk: int


class InstanceHits(TypedDict):
    """Hits of one instance; rank keys are decimal strings such as ``"0"``."""

    longest_matched: int
    dp: Dict[str, int]
    rank_matches: Dict[str, TierCounts]
    device: int
    cpu_local: int
    cpu_share: int
    disk: int


class RankLoad(TypedDict):
    """One DP rank's load as SGLang's ``/v1/loads`` reports it."""

    num_running_reqs: int
    num_waiting_reqs: int
    token_usage: float


class InstanceLoad(TypedDict, total=False):
    """An engine's last load figures (``query(include_load=True)``): their age, vLLM's
    ``server_load``, SGLang's per-rank figures."""

    age_ms: int
    server_load: int
    ranks: Dict[str, RankLoad]


class QueryResult(TypedDict):
    """``query()`` result; ``hits`` maps instance IDs to their hits and is ``{}`` on failure."""

    ret: int
    hits: Dict[str, InstanceHits]


class QueryResultWithLoads(QueryResult):
    """``query(include_load=True)`` result: ``loads`` maps the instances registered by URL
    whose load was read to their engine's last figures (``{}`` on failure)."""

    loads: Dict[str, InstanceLoad]


class CacheGroupStatus(TypedDict):
    """One KV-cache group of a hybrid model's rank: its index, its kind (``"full_attention"``,
    ``"sliding_window"``, ``"mamba"``, ``"chunked_local_attention"`` or ``"unknown"``) and, for
    a sliding window, its size in tokens (else ``None``)."""

    group: int
    kind: str
    sliding_window: Optional[int]


class RankStatus(TypedDict):
    """How sure one DP rank's figures are, with the state of the subscription that feeds it
    (``""`` when none does) and the milliseconds since its last batch (``None`` before the
    first); ``groups`` lists a hybrid model's KV-cache groups in the order the engine checks
    them (full attention first) and is ``[]`` for a single full-attention group."""

    status: str
    reason: str
    state: str
    lag_ms: Optional[int]
    groups: List[CacheGroupStatus]


class InstanceStatus(TypedDict):
    """How sure an instance's figures are (``query(include_status=True)``): ``"exact"``,
    ``"upper_bound"`` or ``"lower_bound"``, with a ``reason`` (``""`` when exact); exact only
    when every rank is. Rank keys are decimal strings."""

    status: str
    reason: str
    ranks: Dict[str, RankStatus]


class QueryResultWithStatus(QueryResult):
    """``query(include_status=True)`` result: ``status`` maps the instances of ``hits`` to how
    sure their figures are (``{}`` on failure)."""

    status: Dict[str, InstanceStatus]


class HashProfileConfig(TypedDict, total=False):
    """The ``hash_profile`` accepted by ``register()`` (exactly these keys, string values)."""

    strategy: str
    algorithm: str
    python_hash_seed: str
    index_projection: str


class RegisterConfig(TypedDict, total=False):
    """``register()`` input. ``endpoint``, ``model_name``, ``block_size`` and ``hash_profile`` are
    required by the server (and ``instance_id`` for vLLM/SGLang publishers)."""

    instance_id: str
    endpoint: str
    model_name: str
    block_size: int
    hash_profile: HashProfileConfig
    replay_endpoint: str
    publisher_type: str
    lora_name: str
    tenant_id: str
    dp_rank: int
    cache_group: Optional[int]
    hybrid_parts: Union[str, List[str], Tuple[str, ...], None]


class HashProfile(TypedDict):
    """A resolved hash recipe, including the server-derived ``root_digest``."""

    strategy: str
    algorithm: str
    python_hash_seed: str
    root_digest: str
    index_projection: str


class ContextView(TypedDict):
    """One indexed model context of ``get_global_view()``."""

    model_name: str
    lora_name: str
    block_size: int
    tenant_id: str
    prefix_count: int
    hash_profile: HashProfile
    instances: Dict[str, Set[int]]


class GlobalView(TypedDict):
    """``get_global_view()`` result; ``context_count`` 0 and ``contexts`` [] on failure."""

    ret: int
    context_count: int
    contexts: List[ContextView]


# Export keys are PascalCase (the service-list format of the HTTP API), hence the functional form.
ServiceEntry = TypedDict(
    "ServiceEntry",
    {
        "Endpoint": str,
        "ReplayEndpoint": str,
        "Type": str,
        "ModelName": str,
        "LoraName": str,
        "TenantID": str,
        "InstanceID": str,
        "BlockSize": int,
        "DPRank": int,
        "CacheGroup": Optional[int],
        "HashProfile": HashProfile,
    },
)


class ServiceList(TypedDict):
    """``list_services()`` result; ``count`` 0 and ``services`` [] on failure."""

    ret: int
    count: int
    services: List[ServiceEntry]


class EngineRank(TypedDict):
    """One DP rank ``register_engine()`` registered, with endpoints reachable from the server."""

    dp_rank: int
    endpoint: str
    replay_endpoint: str
    topic: str
    block_size: int


class EngineRegistration(TypedDict):
    """``register_engine()`` result; on failure ``ret`` is negative and the rest empty."""

    ret: int
    instance_id: str
    model_name: str
    ranks: List[EngineRank]
