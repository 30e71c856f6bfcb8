"""Two-process demo: a prefill (P) and a decode (D) Python process move a
small KV cache over kvxfer (READ: D pulls; WRITE: P pushes) on 127.0.0.1,
and D checks every byte of its KV memory.

    python3 -m kvxfer.demo --mode read       # orchestrates P and D
    python3 -m kvxfer.demo --mode write

The orchestrator plays the proxy: it passes P's response params to D
(build_decode_params) and, in WRITE mode, D's registration to P
(build_prefill_params). Each role can also be run alone (--role).
"""
import argparse
import json
import os
import random
import select
import socket
import subprocess
import sys
import time

import kvxfer

LAYERS = 3
SHAPE = (2, 0, 4, 2, 16)  # [K/V, num_blocks, block_size, heads, head_size]
ELEM = 2                  # bf16
BLOCK_BYTES = SHAPE[2] * SHAPE[3] * SHAPE[4] * ELEM
NB = {"prefill": 24, "decode": 16}
P_IDS = [1, 4, 7, 10, 13, 16, 23]
D_IDS = [2, 5, 8, 11, 14, 15, 0]
FILL = 0x5A
TIMEOUT_S = 60


def block_pattern(layer, kv, block):
    """P's bytes of (layer, K or V, block): distinct for every block."""
    return random.Random(layer * 1000003 + kv * 1009 + block) \
        .randbytes(BLOCK_BYTES)


def make_kv(role):
    """One bytearray per layer, [2, NB, 4, 2, 16] bf16; P holds the pattern,
    D the fill byte."""
    nb = NB[role]
    layers = []
    for l in range(LAYERS):
        if role == "prefill":
            buf = bytearray().join(block_pattern(l, kv, b)
                                   for kv in range(2) for b in range(nb))
        else:
            buf = bytearray([FILL]) * (2 * nb * BLOCK_BYTES)
        layers.append(buf)
    return layers


def verify_decode(layers):
    """Every byte of D's layers: received blocks equal P's pattern, all
    others still hold the fill byte. Returns the bytes compared."""
    src = dict(zip(D_IDS, P_IDS))
    fill = bytes([FILL]) * BLOCK_BYTES
    for l, buf in enumerate(layers):
        for kv in range(2):
            for b in range(NB["decode"]):
                off = (kv * NB["decode"] + b) * BLOCK_BYTES
                want = block_pattern(l, kv, src[b]) if b in src else fill
                got = bytes(buf[off:off + BLOCK_BYTES])
                if got != want:
                    bad = next(i for i in range(BLOCK_BYTES)
                               if got[i] != want[i])
                    raise SystemExit(
                        "MISMATCH layer %d %s block %d byte %d: got %#x, "
                        "want %#x" % (l, "KV"[kv], b, bad, got[bad],
                                      want[bad]))
    return sum(len(b) for b in layers)


def make_engine(role, mode, hs, notify, tls):
    cfg = {"role": "kv_producer" if role == "prefill" else "kv_consumer",
           "tp_rank": 0, "tp_size": 1,
           "kv_connector_extra_config": {
               "read_mode": mode == "read", "host_ip": "127.0.0.1",
               "handshake_port": hs, "notify_port": notify,
               "ucx_tls": tls, "trusted_remote_hosts": ["127.0.0.1"],
               "transfer_timeout": 30, "defer_timeout": 60}}
    eng = kvxfer.Engine(cfg)
    layers = make_kv(role)
    shape = list(SHAPE)
    shape[1] = NB[role]
    for l, buf in enumerate(layers):
        eng.register_layer("model.layers.%d.attn" % l, buf, shape=shape,
                           dtype="bfloat16", block_size=SHAPE[2],
                           num_kv_heads=SHAPE[3], head_size=SHAPE[4])
    eng.start()
    return eng, layers


def read_line(prefix):
    line = sys.stdin.readline()
    if not line.startswith(prefix + " "):
        raise SystemExit("expected '%s <json>' on stdin, got %r"
                         % (prefix, line[:80]))
    return json.loads(line[len(prefix) + 1:])


def run_prefill(a):
    eng, layers = make_engine("prefill", a.mode, a.hs_port, a.notify_port,
                              a.tls)
    with eng:
        params = {"transfer_id": a.transfer_id, "do_remote_decode": True}
        if a.mode == "write":
            print("READY", flush=True)
            params = read_line("PARAMS")       # from D's registration
        resp = eng.producer_request(a.request_id, params, P_IDS)
        print("PARAMS " + json.dumps(resp), flush=True)
        if a.mode == "write":
            for name in eng.layers:            # as each layer is computed
                eng.layer_ready(a.transfer_id, name)
            eng.seal_transfer(a.transfer_id)
        ev = eng.wait_event(a.transfer_id, TIMEOUT_S * 1000)
        print("RELEASED %s %s" % (ev.transfer_id, ev.type), flush=True)
        if layers != make_kv("prefill"):
            raise SystemExit("P's KV memory changed")
    return 0


def run_decode(a):
    eng, layers = make_engine("decode", a.mode, a.hs_port, a.notify_port,
                              a.tls)
    with eng:
        if a.mode == "write":
            print("REG " + json.dumps(eng.registration_payload()), flush=True)
        params = read_line("PARAMS")
        t0 = time.monotonic()
        eng.consumer_request(a.request_id, params, D_IDS)
        for name in eng.layers:
            eng.wait_layer(a.transfer_id, name, TIMEOUT_S * 1000)
        ev = eng.wait_event(a.transfer_id, TIMEOUT_S * 1000)
        ms = (time.monotonic() - t0) * 1000
        n = verify_decode(layers)
        print("VERIFIED %d bytes compared, %d blocks x %d layers x K+V "
              "received, %s in %.1f ms (%s)" % (n, len(D_IDS), LAYERS,
                                                ev.type, ms, a.mode),
              flush=True)
    return 0


def _ephemeral_low():
    """The first port the kernel hands out to outgoing connections."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_ports(n):
    """n ports free on 127.0.0.1 now, below the ephemeral range: a port the
    kernel picked (bind to 0) comes from that range, where any outgoing
    connection made before the engine listens (UCX's tcp lanes, nng's
    dialers, earlier tests) may take it ("Address in use" at start)."""
    hi = max(_ephemeral_low(), 11000)
    socks, ports = [], []
    try:
        for _ in range(1000):
            if len(ports) == n:
                break
            port = random.randrange(10000, hi)
            if port in ports:
                continue
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                s.close()
                continue
            socks.append(s)
            ports.append(port)
    finally:
        for s in socks:
            s.close()
    if len(ports) < n:
        raise RuntimeError("free_ports: no %d free ports in 10000..%d "
                           "after 1000 tries" % (n, hi - 1))
    return ports


class Child:
    def __init__(self, role, a, hs, notify, tid, rid):
        cmd = [sys.executable, "-m", "kvxfer.demo", "--role", role,
               "--mode", a.mode, "--tls", a.tls, "--hs-port", str(hs),
               "--notify-port", str(notify), "--transfer-id", tid,
               "--request-id", rid]
        self.role = role
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        self.lines = []

    def expect(self, prefix, deadline):
        """The first stdout line starting with prefix (within deadline)."""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise SystemExit("%s: no '%s' line in time" % (self.role,
                                                               prefix))
            r, _, _ = select.select([self.p.stdout], [], [], left)
            if r:
                line = self.p.stdout.readline()
                if not line:
                    raise SystemExit("%s exited (%s) before '%s'"
                                     % (self.role, self.p.wait(), prefix))
                self.lines.append(line.rstrip())
                print("%-7s| %s" % (self.role, line.rstrip()), flush=True)
                if line.startswith(prefix):
                    return line[len(prefix):].strip()

    def send(self, line):
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()

    def finish(self, deadline):
        try:
            out, _ = self.p.communicate(
                timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.communicate()
            raise SystemExit("%s: did not exit in time" % self.role)
        for line in out.splitlines():
            self.lines.append(line)
            print("%-7s| %s" % (self.role, line), flush=True)
        return self.p.returncode


def orchestrate(a):
    hs_p, nt_p, hs_d, nt_d = free_ports(4)
    tid = "tx-py-%s-%d" % (a.mode, os.getpid())
    rid = kvxfer.request_id("127.0.0.1", hs_p, nt_p, "127.0.0.1", hs_d,
                            nt_d, os.urandom(16).hex())
    deadline = time.monotonic() + TIMEOUT_S
    kids = []
    try:
        p = Child("prefill", a, hs_p, nt_p, tid, rid)
        kids.append(p)
        if a.mode == "write":
            d = Child("decode", a, hs_d, nt_d, tid, rid)
            kids.append(d)
            reg = json.loads(d.expect("REG", deadline))
            p.expect("READY", deadline)
            p.send("PARAMS " + json.dumps(kvxfer.build_prefill_params(reg,
                                                                      tid)))
        resp = json.loads(p.expect("PARAMS", deadline))
        dparams = kvxfer.build_decode_params(resp, tid)
        if a.mode == "read":
            d = Child("decode", a, hs_d, nt_d, tid, rid)
            kids.append(d)
        d.send("PARAMS " + json.dumps(dparams))
        rc_d = d.finish(deadline)
        rc_p = p.finish(deadline)
    finally:
        for k in kids:
            if k.p.poll() is None:
                k.p.kill()
                k.p.wait()
    verified = any(l.startswith("VERIFIED") for l in d.lines)
    ok = rc_d == 0 and rc_p == 0 and verified
    print("%s: prefill exit %d, decode exit %d" % ("PASS" if ok else "FAIL",
                                                   rc_p, rc_d))
    return 0 if ok else 1


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=("read", "write"), default="read")
    ap.add_argument("--role", choices=("prefill", "decode"))
    ap.add_argument("--tls", default="tcp")
    ap.add_argument("--hs-port", type=int)
    ap.add_argument("--notify-port", type=int)
    ap.add_argument("--transfer-id")
    ap.add_argument("--request-id")
    a = ap.parse_args(argv)
    if a.role == "prefill":
        return run_prefill(a)
    if a.role == "decode":
        return run_decode(a)
    return orchestrate(a)


if __name__ == "__main__":
    sys.exit(main())
