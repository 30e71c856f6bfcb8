"""The UCX frictions fixed in the library: ucx_tcp_port_range bounds the
ports UCX's tcp transport listens on; UCX's warnings reach kvxfer's logger
(not stdout)."""
import os
import subprocess
import sys

import kvxfer
from kvxfer import demo

from .conftest import engine_config

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def listening_ports():
    """TCP ports this process listens on (/proc: sockets of our fds)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink("/proc/self/fd/" + fd)
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    ports = set()
    for path in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        with open(path) as f:
            for line in f.readlines()[1:]:
                c = line.split()
                if c[3] == "0A" and c[9] in inodes:   # LISTEN
                    ports.add(int(c[1].rsplit(":", 1)[1], 16))
    return ports


def ucx_ports(**extra):
    before = listening_ports()
    hs, nt = demo.free_ports(2)
    with kvxfer.Engine(engine_config("kv_consumer", "read", hs, nt,
                                     **extra)) as eng:
        eng.register_layer("l0", bytearray(4096), shape=[2, 8, 4, 2, 16],
                           dtype=2, block_size=4, num_kv_heads=2,
                           head_size=16)
        eng.start()
        assert eng.config()["kv_connector_extra_config"].get(
            "ucx_tcp_port_range", "") == extra.get("ucx_tcp_port_range", "")
        return listening_ports() - before - {hs, nt}


def test_tcp_port_range_bounds_ucx_listeners():
    lo, hi = 21000, 21063
    ports = ucx_ports(ucx_tcp_port_range="%d-%d" % (lo, hi))
    assert ports, "UCX's tcp transport opened no listener"
    assert all(lo <= p <= hi for p in ports), ports
    # Without the key the OS picks them (ephemeral range): the check above
    # can fail.
    free = ucx_ports()
    assert free and not all(lo <= p <= hi for p in free), free


def test_ucx_warnings_go_to_the_logger_not_stdout():
    code = (
        "import kvxfer\n"
        "from tests.conftest import engine_config\n"
        "got = []\n"
        "kvxfer.set_logger(lambda lvl, i, m: got.append((lvl, i, m)), 1)\n"
        "e = kvxfer.Engine(engine_config('kv_consumer', 'read', 17000, "
        "17001, ucx_tls='tcp,bogus_tl'))\n"
        "e.close()\n"
        "kvxfer.set_logger(None)\n"
        "import sys\n"
        "ucx = [g for g in got if g[1] == 'KVX-UCX' and 'bogus_tl' in g[2]]\n"
        "sys.stderr.write(repr(got))\n"
        "sys.exit(0 if ucx and ucx[0][0] == 1 else 3)\n")
    env = dict(os.environ, PYTHONPATH=HERE)
    r = subprocess.run([sys.executable, "-c", code], env=env, cwd=HERE,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "bogus_tl" not in r.stdout, r.stdout
