"""Errors carry the status name and the failing call's message; last_error
is cleared by a successful call (ABI 1.3)."""
import threading

import pytest

import kvxfer
from kvxfer import demo

from .conftest import engine_config


def test_bad_config_names_key_value_and_rule():
    with pytest.raises(kvxfer.ConfigError) as e:
        kvxfer.Engine(engine_config("kv_consumer", "read", 17000, 17001,
                                    handshake_port=80))
    err = e.value
    assert err.status == -2 and err.name == "KVX_ERR_CONFIG"
    assert err.call == "engine_create"
    assert "handshake_port" in err.message and "80" in err.message
    assert "KVX_ERR_CONFIG" in str(err)


@pytest.mark.parametrize("value", ["70000-70001", "2000-1500", "80-90",
                                   "1024", "a-b", "1024-2048x"])
def test_port_range_is_validated(value):
    with pytest.raises(kvxfer.ConfigError) as e:
        kvxfer.Engine(engine_config("kv_consumer", "read", 17000, 17001,
                                    ucx_tcp_port_range=value))
    assert "ucx_tcp_port_range" in e.value.message
    assert value in e.value.message and "lo-hi" in e.value.message


def test_state_and_lookup_errors(read_pair):
    with pytest.raises(kvxfer.ConfigError) as e:
        read_pair.d.producer_request("r", {"transfer_id": "t"}, [1])
    assert e.value.name == "KVX_ERR_BAD_STATE"
    assert "producer_request on a kv_consumer" in e.value.message
    with pytest.raises(kvxfer.KvxError) as e:
        read_pair.d.wait_transfer("no-such-transfer", 100)
    assert e.value.name == "KVX_ERR_NOT_FOUND"
    with pytest.raises(kvxfer.KvxError) as e:
        read_pair.d.layer_index("no.such.layer")
    assert e.value.name == "KVX_ERR_NOT_FOUND"
    with pytest.raises(kvxfer.KvxError) as e:
        read_pair.p.register_layer("late", bytearray(4096), shape=[2, 8, 4,
                                   2, 16], dtype=2, block_size=4,
                                   num_kv_heads=2, head_size=16)
    assert e.value.name == "KVX_ERR_BAD_STATE"


def test_wait_timeout_is_a_timeout_error(read_pair):
    assert read_pair.p.wait_events(10) is False
    with pytest.raises(TimeoutError) as e:
        read_pair.p.wait_event("never", 50)
    assert e.value.name == "KVX_ERR_TIMEOUT"


def test_last_error_is_cleared_by_a_success(read_pair):
    api = kvxfer.load()
    with pytest.raises(kvxfer.KvxError):
        read_pair.d.wait_transfer("no-such-transfer", 0)
    assert api.last_error() != b""
    # Calls that kept an older message before ABI 1.3.
    for call in (read_pair.d.stats, read_pair.d.config,
                 read_pair.d.transports, read_pair.d.poll_events):
        with pytest.raises(kvxfer.KvxError):
            read_pair.d.wait_transfer("no-such-transfer", 0)
        call()
        assert api.last_error() == b"", call


def test_last_error_is_per_thread(read_pair):
    """A failure on another thread does not show in this thread's message."""
    api = kvxfer.load()
    read_pair.d.stats()

    def fail():
        with pytest.raises(kvxfer.KvxError):
            read_pair.d.wait_transfer("other-thread", 0)

    t = threading.Thread(target=fail)
    t.start()
    t.join(30)
    assert api.last_error() == b""


def test_bad_buffers_are_refused_before_the_library():
    hs, nt = demo.free_ports(2)
    with kvxfer.Engine(engine_config("kv_consumer", "read", hs, nt)) as eng:
        with pytest.raises(ValueError, match="read-only"):
            eng.register_layer("ro", b"\0" * 8192, shape=[2, 8, 4, 2, 16],
                               dtype=2, block_size=4, num_kv_heads=2,
                               head_size=16)
        with pytest.raises(ValueError, match="spans 4096 bytes, the buffer "
                                             "has 2048"):
            eng.register_layer("small", bytearray(2048),
                               shape=[2, 8, 4, 2, 16], dtype=2,
                               block_size=4, num_kv_heads=2, head_size=16)
        with pytest.raises(ValueError, match="unknown"):
            eng.register_layer("dt", bytearray(8192), shape=[2, 8, 4, 2, 16],
                               dtype="complex512", block_size=4,
                               num_kv_heads=2, head_size=16)
        # The library's own geometry check names the layer.
        with pytest.raises(kvxfer.KvxError) as e:
            eng.register_layer("geo", bytearray(8192),
                               shape=[2, 8, 4, 2, 16], dtype=2,
                               block_size=4, num_kv_heads=3, head_size=16)
        assert "geo" in e.value.message


def test_proxy_helper_errors():
    with pytest.raises(kvxfer.KvxError) as e:
        kvxfer.build_decode_params("{not json", "t")
    assert e.value.call == "build_decode_params" and e.value.message


def test_closed_engine():
    hs, nt = demo.free_ports(2)
    eng = kvxfer.Engine(engine_config("kv_consumer", "read", hs, nt))
    eng.close()
    eng.close()  # idempotent
    with pytest.raises(kvxfer.KvxError, match="closed"):
        eng.stats()
