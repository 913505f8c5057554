"""Import surface: constants, exports, and the error when the native extension is missing."""

import inspect
import subprocess
import sys
import textwrap

import pytest

import mooncake.conductor as conductor
from mooncake.conductor import ConductorClient

EXPECTED_CODES = {
    "OK": 0,
    "INTERNAL_ERROR": -1,
    "INVALID_PARAMS": -600,
    "RPC_FAIL": -900,
    "RPC_TIMEOUT": -901,
    "CONDUCTOR_UNAVAILABLE": -2000,
    "SERVICE_NOT_FOUND": -2001,
    "UNAUTHORIZED": -2002,
    "HEALTH_OK": 0,
    "HEALTH_NOT_INITIALIZED": 1,
    "HEALTH_UNREACHABLE": 2,
}


@pytest.mark.parametrize("name,value", sorted(EXPECTED_CODES.items()))
def test_constant_values(name, value):
    assert getattr(conductor, name) == value
    assert type(getattr(conductor, name)) is int
    assert name in conductor.__all__


def test_client_is_exported_from_the_public_module():
    assert "ConductorClient" in conductor.__all__
    from mooncake import _conductor

    assert conductor.ConductorClient is _conductor.ConductorClient
    assert isinstance(ConductorClient(), ConductorClient)


def test_package_ships_type_information():
    from pathlib import Path

    pkg = Path(conductor.__file__).parent
    assert (pkg / "py.typed").is_file()
    assert (pkg / "_conductor.pyi").is_file()


def test_query_arguments_after_model_name_are_keyword_only():
    params = inspect.signature(ConductorClient.query).parameters
    names = [n for n in params if n != "self"]
    assert names == [
        "model_name",
        "lora_name",
        "block_size",
        "tenant_id",
        "token_ids",
        "cache_salt",
        "instance_filter",
        "include_load",
        "include_status",
    ]
    assert params["model_name"].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
    for name in names[1:]:
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY, name
    defaults = {n: params[n].default for n in names}
    assert defaults["lora_name"] == "" and defaults["tenant_id"] == "default"
    assert defaults["cache_salt"] == "" and defaults["instance_filter"] == ""
    assert defaults["include_load"] is False
    assert defaults["include_status"] is False
    assert defaults["block_size"] is inspect.Parameter.empty
    assert defaults["token_ids"] is inspect.Parameter.empty


def test_documented_defaults_of_setup_and_unregister():
    setup = inspect.signature(ConductorClient.setup).parameters
    assert setup["connect_timeout_ms"].default == 1000
    assert setup["request_timeout_ms"].default == 3000
    unregister = inspect.signature(ConductorClient.unregister).parameters
    assert unregister["tenant_id"].default == "default"
    assert unregister["dp_rank"].default == 0


def test_query_rejects_positional_arguments_after_model_name():
    client = ConductorClient()
    with pytest.raises(TypeError):
        client.query("m", "", 16, "default", [1, 2])
    with pytest.raises(TypeError):
        client.query("m", 16, token_ids=[1])
    with pytest.raises(TypeError):
        client.query("m", token_ids=[1])  # block_size is required
    with pytest.raises(TypeError):
        client.query("m", block_size=16)  # token_ids is required
    with pytest.raises(TypeError):
        client.query(model_name="m", block_size=16, token_ids=[1], unknown=1)
    # The documented calling convention is accepted (the client is not connected).
    assert client.query(model_name="m", block_size=16, token_ids=[1])["ret"] == conductor.CONDUCTOR_UNAVAILABLE


BLOCKERS = {
    "meta_path": """
        import importlib.abc, sys
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name == "mooncake._conductor":
                    raise ImportError("No module named 'mooncake._conductor'")
                return None
        sys.meta_path.insert(0, Block())
    """,
    "sys_modules": """
        import sys
        sys.modules["mooncake._conductor"] = None
    """,
}


@pytest.mark.parametrize("blocker", sorted(BLOCKERS))
def test_import_error_when_native_extension_is_missing(blocker):
    code = textwrap.dedent(BLOCKERS[blocker]) + textwrap.dedent(
        """
        import mooncake  # the package itself still imports
        try:
            import mooncake.conductor
        except ImportError as exc:
            print("IMPORT-ERROR:", exc)
            print("CAUSE:", type(exc.__cause__).__name__)
        else:
            print("IMPORTED")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "IMPORTED" not in out.stdout
    message = out.stdout
    assert "IMPORT-ERROR:" in message
    assert "Conductor support is missing" in message
    assert "mooncake._conductor" in message
    assert "package with Conductor support" in message
    assert "rebuild" in message and "pip install ./python" in message
    assert "a rebuild with `WITH_CONDUCTOR=ON`" in message
    assert "CAUSE: ImportError" in message or "CAUSE: ModuleNotFoundError" in message
