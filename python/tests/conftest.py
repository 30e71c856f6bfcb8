"""Shared fixtures: the library comes from KVXFER_LIBRARY (meson sets it to
the build's libkvxfer.so); the package from this source tree."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import kvxfer  # noqa: E402
from kvxfer import demo  # noqa: E402


def engine_config(role, mode, hs, notify, **extra):
    x = {"read_mode": mode == "read", "host_ip": "127.0.0.1",
         "handshake_port": hs, "notify_port": notify, "ucx_tls": "tcp",
         "trusted_remote_hosts": ["127.0.0.1"], "transfer_timeout": 20,
         "defer_timeout": 30}
    x.update(extra)
    return {"role": role, "tp_rank": 0, "tp_size": 1,
            "kv_connector_extra_config": x}


class Pair:
    """A P and a D engine of the demo's model in this process."""

    def __init__(self, mode):
        hs_p, nt_p, hs_d, nt_d = demo.free_ports(4)
        self.mode = mode
        self.ports = (hs_p, nt_p, hs_d, nt_d)
        self.p, self.p_kv = demo.make_engine("prefill", mode, hs_p, nt_p,
                                             "tcp")
        self.d, self.d_kv = demo.make_engine("decode", mode, hs_d, nt_d,
                                             "tcp")
        self.rid = kvxfer.request_id("127.0.0.1", hs_p, nt_p, "127.0.0.1",
                                     hs_d, nt_d, os.urandom(16).hex())

    def start_read(self, tid):
        """P holds, D starts pulling; returns at once."""
        resp = self.p.producer_request(
            self.rid, {"transfer_id": tid, "do_remote_decode": True},
            demo.P_IDS)
        self.d.consumer_request(self.rid,
                                kvxfer.build_decode_params(resp, tid),
                                demo.D_IDS)

    def close(self):
        self.d.close()
        self.p.close()


@pytest.fixture
def read_pair():
    pair = Pair("read")
    yield pair
    pair.close()


@pytest.fixture
def write_pair():
    pair = Pair("write")
    yield pair
    pair.close()
