"""Client of the Mooncake Conductor RPC service.

``ConductorClient`` registers KV event publishers with a running ``mooncake_conductor`` and
queries prefix-cache hits for request routing. Lifecycle and mutating calls return integer
codes (``OK`` or a negative error code); read calls place the code in ``ret``.
``health_check()`` returns one of the separate ``HEALTH_*`` statuses.

Behaviour beyond the API reference:

* ``setup()`` connects eagerly and checks the service with one round trip, all within
  ``connect_timeout_ms``; a peer that does not answer in time gives ``RPC_FAIL``.
  Non-positive timeouts give ``INVALID_PARAMS``.
* A request that exceeds ``request_timeout_ms`` (or that the server reports as past its
  deadline) gives ``RPC_TIMEOUT``; every other transport failure gives ``RPC_FAIL``.
* ``query()`` returns ``INVALID_PARAMS`` for token IDs outside the signed 32-bit range and
  raises ``TypeError`` for arguments of the wrong type.
* When the service requires a token, ``setup()`` reads it from the ``CONDUCTOR_AUTH_TOKEN``
  environment variable (the first entry of a comma-separated list) and every request sends it;
  a request refused for a missing or wrong token gives ``UNAUTHORIZED``.
* Each client owns a small background runtime, created by its first ``setup()``. Calls release
  the GIL while waiting on the network. Do not use a connected client across ``os.fork()``.
"""

try:
    from mooncake._conductor import (
        CONDUCTOR_UNAVAILABLE,
        HEALTH_NOT_INITIALIZED,
        HEALTH_OK,
        HEALTH_UNREACHABLE,
        INTERNAL_ERROR,
        INVALID_PARAMS,
        OK,
        RPC_FAIL,
        RPC_TIMEOUT,
        SERVICE_NOT_FOUND,
        UNAUTHORIZED,
        ConductorClient,
    )
except ImportError as exc:  # the native extension is absent or cannot load
    raise ImportError(
        "Conductor support is missing from this mooncake installation: the native "
        f"extension 'mooncake._conductor' could not be imported ({exc}). Install a mooncake "
        "package with Conductor support, or a rebuild with `WITH_CONDUCTOR=ON` (for Mooncake's "
        "own build); for this package, `pip install ./python` from the mooncake-conductor "
        "source tree (or `maturin develop --release` inside python/)."
    ) from exc

from mooncake._types import (
    ContextView,
    EngineRank,
    EngineRegistration,
    GlobalView,
    HashProfile,
    HashProfileConfig,
    InstanceHits,
    QueryResult,
    RegisterConfig,
    ServiceEntry,
    ServiceList,
    TierCounts,
)

__all__ = [
    "ConductorClient",
    "OK",
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "RPC_FAIL",
    "RPC_TIMEOUT",
    "CONDUCTOR_UNAVAILABLE",
    "SERVICE_NOT_FOUND",
    "UNAUTHORIZED",
    "HEALTH_OK",
    "HEALTH_NOT_INITIALIZED",
    "HEALTH_UNREACHABLE",
    "ContextView",
    "EngineRank",
    "EngineRegistration",
    "GlobalView",
    "HashProfile",
    "HashProfileConfig",
    "InstanceHits",
    "QueryResult",
    "RegisterConfig",
    "ServiceEntry",
    "ServiceList",
    "TierCounts",
]
