"""ASan build only: the leak check of this suite can fail. A process that
drops one `char *` the library returned (instead of api.free) is reported by
LeakSanitizer, so the clean runs of the other tests mean the binding frees
every string and event block list."""
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = pytest.mark.skipif(
    "libasan" not in os.environ.get("LD_PRELOAD", ""),
    reason="runs in the ASan build (meson test python in build-asan)")

LEAK = (
    "import ctypes, kvxfer\n"
    "api = kvxfer.load()\n"
    "out = ctypes.c_void_p()\n"
    "st = api.build_decode_params(b'{\"transfer_id\":\"t\",\"remote_host\":"
    "\"127.0.0.1\",\"remote_handshake_port\":17000,\"remote_notify_port\":"
    "17001,\"remote_block_ids\":[1],\"remote_engine_id\":\"x\","
    "\"tp_size\":1}', b't', ctypes.byref(out))\n"
    "assert st == 0 and out.value\n"
    "%s\n")


def run(tail):
    env = dict(os.environ, PYTHONPATH=HERE)
    return subprocess.run([sys.executable, "-c", LEAK % tail], env=env,
                          capture_output=True, text=True, timeout=120)


def test_a_dropped_string_is_reported_as_a_leak():
    r = run("")
    assert r.returncode != 0
    assert "Direct leak" in r.stderr and "SUMMARY: AddressSanitizer" in \
        r.stderr, r.stderr


def test_the_same_string_freed_is_clean():
    r = run("api.free(out.value)")
    assert r.returncode == 0, r.stderr
    assert "leak" not in r.stderr.lower(), r.stderr
