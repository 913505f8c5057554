"""Fixtures. Tests marked `server` run against the real mooncake_conductor binary named by the
CONDUCTOR_BIN environment variable; they are skipped only when that variable is unset."""

import os
from pathlib import Path

import pytest

from support import ConductorProcess, FakeConductor, SilentPeer

SERVER_SKIP_REASON = (
    "CONDUCTOR_BIN is not set: point it at a built mooncake_conductor binary "
    "to run the tests against the real server"
)


def pytest_collection_modifyitems(config, items):
    if os.environ.get("CONDUCTOR_BIN"):
        return
    skip = pytest.mark.skip(reason=SERVER_SKIP_REASON)
    for item in items:
        if "server" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def conductor_bin() -> str:
    path = os.environ.get("CONDUCTOR_BIN")
    if not path:
        pytest.skip(SERVER_SKIP_REASON)
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        pytest.fail(f"CONDUCTOR_BIN={path!r} is not an executable file; build mooncake_conductor first")
    return path


@pytest.fixture
def conductor(conductor_bin: str, tmp_path: Path):
    """A fresh server per test (its own ports and data dir), stopped afterwards."""
    server = ConductorProcess(conductor_bin, tmp_path)
    yield server
    server.stop()


@pytest.fixture
def client(conductor):
    """A client connected to `conductor`, closed afterwards."""
    from mooncake.conductor import OK, ConductorClient

    c = ConductorClient()
    assert c.setup(conductor.addr) == OK
    yield c
    c.close()


@pytest.fixture
def silent_peer():
    with SilentPeer() as peer:
        yield peer


@pytest.fixture
def fake_conductor():
    """A gRPC peer answering every call with an empty message (see FakeConductor)."""
    with FakeConductor() as peer:
        yield peer
