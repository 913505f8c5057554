"""Native part of :mod:`mooncake.conductor` (use that module; see its documentation)."""

from types import TracebackType
from typing import Any, Final, Iterable, Mapping, Optional, Sequence, Type

from mooncake._types import (
    EngineRegistration,
    GlobalView,
    HashProfileConfig,
    QueryResult,
    RegisterConfig,
    ServiceList,
)

OK: Final[int]  # 0
INTERNAL_ERROR: Final[int]  # -1
INVALID_PARAMS: Final[int]  # -600
RPC_FAIL: Final[int]  # -900
RPC_TIMEOUT: Final[int]  # -901
CONDUCTOR_UNAVAILABLE: Final[int]  # -2000
SERVICE_NOT_FOUND: Final[int]  # -2001
UNAUTHORIZED: Final[int]  # -2002
HEALTH_OK: Final[int]  # 0
HEALTH_NOT_INITIALIZED: Final[int]  # 1
HEALTH_UNREACHABLE: Final[int]  # 2

class ConductorClient:
    """Client of the Conductor RPC service.

    Creates an unconnected client. Call setup() before making requests. Entering a ``with``
    block returns the client (without calling setup()); leaving it calls close(), also when
    the body raises.
    """

    def __init__(self) -> None: ...
    def setup(
        self,
        conductor_addr: str,
        connect_timeout_ms: int = 1000,
        request_timeout_ms: int = 3000,
    ) -> int:
        """Connect to ``host:port``. Returns OK, INVALID_PARAMS (no port separator, malformed
        address, non-positive timeout, a CONDUCTOR_AUTH_TOKEN that is not visible ASCII) or
        RPC_FAIL (not reachable within connect_timeout_ms). Every later request sends the token
        read here from CONDUCTOR_AUTH_TOKEN, if set.
        Each attempt replaces the previous connection; a failed one leaves the client
        uninitialized."""
    def close(self) -> int:
        """Release the connection (does not unregister publishers). Always OK; repeatable."""
    def health_check(self) -> int:
        """HEALTH_OK, HEALTH_NOT_INITIALIZED (no successful setup) or HEALTH_UNREACHABLE."""
    def query(
        self,
        model_name: str,
        *,
        lora_name: str = "",
        block_size: int,
        tenant_id: str = "default",
        token_ids: Iterable[int],
        cache_salt: str = "",
        instance_filter: str = "",
        include_load: bool = False,
        include_status: bool = False,
    ) -> QueryResult:
        """Prefix-cache hits per instance. ``{"ret": <negative>, "hits": {}}`` on failure;
        token IDs outside the signed 32-bit range give INVALID_PARAMS. With
        ``include_load=True`` the result also has ``loads``: per instance registered by URL,
        its engine's last load figures and their age. With ``include_status=True`` it also has
        ``status``: per instance whether its figures are ``"exact"``, an ``"upper_bound"`` or a
        ``"lower_bound"`` (with a reason), per rank with its subscription's state and lag and a
        hybrid model's KV-cache groups."""
    def register(self, config: RegisterConfig | Mapping[str, Any]) -> int:
        """Register one publisher. Returns OK or a negative code (INVALID_PARAMS from the
        server for missing or invalid values). Raises ValueError for a non-dict, unknown or
        non-string keys, wrong types, integers outside int64 or an unknown publisher_type."""
    def unregister(
        self, instance_id: str, tenant_id: str = "default", dp_rank: int = 0
    ) -> int:
        """OK, SERVICE_NOT_FOUND or another negative code."""
    def register_engine(
        self,
        url: str,
        publisher_type: str = "vLLM",
        *,
        instance_id: str | None = None,
        tenant_id: str = "default",
        model_name: str | None = None,
        block_size: int | None = None,
        hash_profile: HashProfileConfig | Mapping[str, str] | None = None,
        hybrid_parts: str | Sequence[str] | None = None,
    ) -> EngineRegistration:
        """Register an engine by its HTTP URL: one subscription per DP rank its own
        description names, kept in step with the engine. On failure ret is negative."""
    def unregister_engine(self, instance_id: str, tenant_id: str = "default") -> int:
        """Stop following an engine and unregister its ranks: OK, SERVICE_NOT_FOUND or
        another negative code."""
    def get_global_view(self) -> GlobalView:
        """Snapshot of indexed contexts; ``context_count`` 0 and ``contexts`` [] on failure."""
    def list_services(self) -> ServiceList:
        """Active publisher configurations; ``count`` 0 and ``services`` [] on failure."""
    def __enter__(self) -> "ConductorClient": ...
    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc_value: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> bool: ...
