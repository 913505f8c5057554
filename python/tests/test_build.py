"""The binary these tests run against is the one users run (scripts/run.sh's `cargo build
--release`): it must carry no debug assertions and none of the test builds' hooks
(docs/build.md)."""

import re
import urllib.request

import pytest

pytestmark = pytest.mark.server

TEST_HOOKS = (
    b"CONDUCTOR_FAILPOINT",
    b"CONDUCTOR_TEST_FAIL_WRITES_WHILE",
    b"CONDUCTOR_TEST_APPLY_DELAY_MS",
    b"CONDUCTOR_TEST_CHAIN_TUNING",
)


def test_the_executable_reads_no_test_hook(conductor_bin):
    with open(conductor_bin, "rb") as f:
        image = f.read()
    found = [hook.decode() for hook in TEST_HOOKS if hook in image]
    assert found == [], f"test hooks compiled into the binary users run: {found}"


def test_metrics_say_release_build_without_test_hooks(conductor):
    with urllib.request.urlopen(f"http://127.0.0.1:{conductor.http_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    info = re.search(r"^conductor_build_info\{([^}]*)\} 1$", text, re.M)
    assert info, "conductor_build_info missing from /metrics"
    labels = dict(re.findall(r'(\w+)="([^"]*)"', info.group(1)))
    assert labels["debug_assertions"] == "false", labels
    assert labels["test_hooks"] == "false", labels
