"""P and D as two Python processes (kvxfer.demo), READ and WRITE, every
byte of D's KV memory checked; and in-process transfers through the
binding's buffer, pointer and layer-name paths."""
import os
import subprocess
import sys

import pytest

import kvxfer
from kvxfer import demo

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("mode", ["read", "write"])
def test_two_processes_every_byte(mode):
    env = dict(os.environ, PYTHONPATH=HERE)
    r = subprocess.run([sys.executable, "-m", "kvxfer.demo", "--mode", mode],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    verified = [l for l in r.stdout.splitlines() if "VERIFIED" in l]
    assert len(verified) == 1, r.stdout
    assert "%d bytes compared" % (demo.LAYERS * 2 * demo.NB["decode"] *
                                  demo.BLOCK_BYTES) in verified[0]
    assert "RELEASED" in r.stdout and "PASS" in r.stdout


def test_the_check_catches_one_wrong_byte():
    """verify_decode fails on one flipped byte of a received block and on
    one written byte outside the received blocks."""
    good = demo.make_kv("decode")
    src = dict(zip(demo.D_IDS, demo.P_IDS))
    for l, buf in enumerate(good):
        for kv in range(2):
            for d, p in src.items():
                off = (kv * demo.NB["decode"] + d) * demo.BLOCK_BYTES
                buf[off:off + demo.BLOCK_BYTES] = demo.block_pattern(l, kv, p)
    assert demo.verify_decode(good) > 0
    off = (1 * demo.NB["decode"] + demo.D_IDS[3]) * demo.BLOCK_BYTES + 77
    good[2][off] ^= 1
    with pytest.raises(SystemExit, match="MISMATCH layer 2 V"):
        demo.verify_decode(good)
    good[2][off] ^= 1
    good[0][(0 * demo.NB["decode"] + 1) * demo.BLOCK_BYTES] ^= 0xFF
    with pytest.raises(SystemExit, match="MISMATCH layer 0 K block 1 byte 0"):
        demo.verify_decode(good)


def test_in_process_read_waits_by_layer_name(read_pair):
    tid = "tx-inproc-read"
    read_pair.start_read(tid)
    for name in read_pair.d.layers:
        read_pair.d.wait_layer(tid, name, 20000)
    read_pair.d.wait_transfer(tid, 20000)
    ev = read_pair.d.wait_event(tid, 20000)
    assert ev.type == "FINISHED_RECVING" and ev.status == 0
    assert ev.status_name == "KVX_OK"
    demo.verify_decode(read_pair.d_kv)
    ev = read_pair.p.wait_event(tid, 20000)
    assert ev.type == "FINISHED_SENDING"
    st = read_pair.d.stats()
    assert isinstance(st, dict) and st.get("bytes_read", 0) > 0, st
    tr = read_pair.d.transports()
    assert isinstance(tr, list) and tr, tr


def test_in_process_write(write_pair):
    w, tid = write_pair, "tx-inproc-write"
    reg = w.d.registration_payload()
    pparams = kvxfer.build_prefill_params(reg, tid)
    assert pparams["remote_handshake_port"] == w.ports[2]
    resp = w.p.producer_request(w.rid, pparams, demo.P_IDS)
    for i in reversed(range(demo.LAYERS)):   # any order, by index
        w.p.layer_ready(tid, i)
    w.p.seal_transfer(tid)
    w.d.consumer_request(w.rid, kvxfer.build_decode_params(resp, tid),
                         demo.D_IDS)
    assert w.d.wait_event(tid, 20000).type == "FINISHED_RECVING"
    demo.verify_decode(w.d_kv)
    assert w.p.wait_event(tid, 20000).type == "FINISHED_SENDING"


def test_register_by_pointer_shape_strides_dtype():
    """A raw pointer with shape/strides/dtype as a framework's tensor
    reports them registers the same geometry as the buffer path."""
    import ctypes
    hs, nt = demo.free_ports(2)
    cfg = {"role": "kv_consumer", "kv_connector_extra_config": {
        "read_mode": True, "host_ip": "127.0.0.1", "handshake_port": hs,
        "notify_port": nt, "ucx_tls": "tcp"}}
    shape = [2, 8, 4, 2, 16]
    n = 1
    for s in shape:
        n *= s
    mem = (ctypes.c_uint16 * n)()
    with kvxfer.Engine(cfg) as eng:
        i = eng.register_layer("l0", ptr=ctypes.addressof(mem), shape=shape,
                               strides=[8 * 128, 128, 32, 16, 1],
                               dtype="torch.bfloat16", block_size=4,
                               num_kv_heads=2, head_size=16)
        j = eng.register_layer("l1", memoryview(bytearray(n * 2)),
                               shape=shape, dtype=2, block_size=4,
                               num_kv_heads=2, head_size=16)
        assert (i, j) == (0, 1) and eng.layer_index("l1") == 1
        eng.start()
        assert eng.config()["kv_connector_extra_config"]["handshake_port"] \
            == hs


def test_connect_peer_then_read(read_pair):
    hs_p, nt_p = read_pair.ports[0], read_pair.ports[1]
    read_pair.d.connect_peer({"remote_host": "127.0.0.1",
                              "remote_handshake_port": hs_p,
                              "remote_notify_port": nt_p}, 20000)
    assert read_pair.d.stats()["handshakes_ok"] == 1
    read_pair.start_read("tx-after-connect")
    assert read_pair.d.wait_event("tx-after-connect", 20000).ok
    demo.verify_decode(read_pair.d_kv)
    assert read_pair.d.stats()["handshakes_ok"] == 1   # reused


def test_consumer_abort_releases_the_producer(write_pair):
    w, tid = write_pair, "tx-abort"
    pparams = kvxfer.build_prefill_params(w.d.registration_payload(), tid)
    resp = w.p.producer_request(w.rid, pparams, demo.P_IDS)
    w.d.consumer_abort(w.rid, kvxfer.build_decode_params(resp, tid))
    ev = w.p.wait_event(tid, 20000)
    assert ev.type == "FINISHED_SENDING" and "released" in ev.reason
    assert ev.transfer_id == tid and ev.request_id == w.rid
    assert sorted(ev.block_ids) == sorted(demo.P_IDS)
