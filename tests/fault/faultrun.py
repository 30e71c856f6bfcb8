#!/usr/bin/python3
"""Real-process fault campaign of kvxfer (tests/fault/README.md).

Runs rounds of a fault scenario against two kvx_faultpeer processes (P and
D, real UCX + nng on 127.0.0.1) and checks, per round: no transfer reported
OK with wrong bytes, no write into blocks D was told are free, no crashed
process, every failure reported within its deadline + 1 s with the right
blocks, no block pinned on P at the end, a new transfer works after the
fault. Prints a table per scenario and exits 1 on any violation.
"""
import argparse
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

SCENARIOS = {
    "kill_p": "kill -9 of P mid-transfer",
    "kill_d": "kill -9 of D mid-transfer",
    "stop_p": "SIGSTOP P mid-transfer, SIGCONT after a random pause",
    "stop_d": "SIGSTOP D mid-transfer, SIGCONT after a random pause",
    "restart_p": "kill -9 of P mid-transfer, new P on the same ports",
    "restart_d": "kill -9 of D mid-transfer, new D on the same ports",
    "destroy_p": "engine_destroy on P mid-transfer",
    "destroy_d": "engine_destroy on D mid-transfer",
    "abort_d": "consumer_abort on D mid-transfer",
}
# Not in the default list: D flips one bit of the warm-up transfer before
# its check; the round passes only if the campaign reports it.
SELFTEST = "corrupt_selftest"
MODES = ("read", "write")
TLS = ("tcp", "sm")
HS_TO, XFER_TO, DEFER_TO = 2, 2, 4
# UCX 1.13's shared-memory FIFO has no recovery: a process killed between
# reserving a FIFO element of its peer and publishing it blocks the peer's
# receive FIFO for good, so after `restart` over sm the next transfer can
# fail (at its deadline, on both sides). README "Known limits".
SM_FIFO_LIMIT = "UCX 1.13 sm FIFO blocked by the killed process"
LAYERS, POOL, NBLOCKS = 16, 64, 32
CRASH_RE = re.compile(r"AddressSanitizer|LeakSanitizer|UndefinedBehavior|"
                      r"runtime error:|Fatal:|Assertion|assertion|panic|"
                      r"Segmentation|Aborted|core dumped")


def now():
    return time.monotonic()  # CLOCK_MONOTONIC, as the peers' timestamps


class Peer:
    """One kvx_faultpeer process: commands on stdin, JSON lines on stdout."""

    def __init__(self, args, side, inst, mode, tls, ports, workdir, tag):
        self.side, self.inst = side, inst
        hs, nt, phs, pnt = ports if side == "p" else (
            ports[2], ports[3], ports[0], ports[1])
        self.errpath = os.path.join(workdir, "%s-%s%d.err" % (tag, side, inst))
        self.logpath = os.path.join(workdir, "%s-%s%d.jsonl" % (tag, side, inst))
        cmd = [args.peer, "--role", side, "--mode", mode, "--tls", tls,
               "--hs", str(hs), "--notify", str(nt), "--peer-hs", str(phs),
               "--peer-notify", str(pnt), "--inst", str(inst),
               "--layers", str(LAYERS), "--pool", str(POOL),
               "--timeouts", "%d,%d,%d" % (HS_TO, XFER_TO, DEFER_TO),
               "--log", self.logpath, "--max-life", str(args.max_life),
               "--layer-gap-us", str(20000 if mode == "write" else 0)]
        if args.lib:
            cmd += ["--lib", args.lib]
        if side == "d" and args.corrupt:
            cmd += ["--corrupt"]
        self.cmd = cmd
        self.err = open(self.errpath, "w")
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=self.err,
                                  bufsize=0)
        self.lines = []
        self.cv = threading.Condition()
        self.eof = False
        self.expect_signal = None
        self.stopped_until = 0.0
        self.t = threading.Thread(target=self._read, daemon=True)
        self.t.start()

    def _read(self):
        for raw in self.p.stdout:
            try:
                obj = json.loads(raw.decode("utf-8", "replace"))
            except ValueError:
                obj = {"ev": "garbage", "raw": raw.decode("utf-8", "replace")}
            obj["_t"] = now()
            with self.cv:
                self.lines.append(obj)
                self.cv.notify_all()
        with self.cv:
            self.eof = True
            self.cv.notify_all()

    def send(self, line):
        try:
            self.p.stdin.write((line + "\n").encode())
            self.p.stdin.flush()
            return True
        except (BrokenPipeError, OSError):
            return False

    def wait_for(self, pred, deadline):
        """First line (from the start) matching pred, or None at deadline."""
        with self.cv:
            i = 0
            while True:
                while i < len(self.lines):
                    if pred(self.lines[i]):
                        return self.lines[i]
                    i += 1
                left = deadline - now()
                if left <= 0 or self.eof:
                    return None
                self.cv.wait(left)

    def find(self, pred):
        with self.cv:
            return [x for x in self.lines if pred(x)]

    def alive(self):
        return self.p.poll() is None

    def finish(self, deadline):
        """QUIT (destroys the engine), wait for exit; returns exit status."""
        if self.alive():
            self.send("QUIT")
            try:
                self.p.stdin.close()
            except OSError:
                pass
        try:
            rc = self.p.wait(max(0.1, deadline - now()))
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
            rc = "hang"
        self.t.join(5)
        self.err.close()
        return rc

    def fifo_retirements(self):
        """Workers this process retired because its shared-memory receive
        FIFO was blocked (transports/ucx/README.md, the watchdog)."""
        with open(self.errpath, errors="replace") as f:
            return sum(1 for l in f if "[KVX-UCX-FIFO]" in l and
                       "retired" in l)

    def stderr_problems(self):
        with open(self.errpath, errors="replace") as f:
            text = f.read()
        return [l for l in text.splitlines() if CRASH_RE.search(l)][:5]


def free_ports(rng, lo, hi, n=4):
    for _ in range(200):
        base = rng.randrange(lo, hi - n)
        ok = True
        for port in range(base, base + n):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                ok = False
            s.close()
            if not ok:
                break
        if ok:
            return list(range(base, base + n))
    raise RuntimeError("no 4 free consecutive ports")


class Round:
    def __init__(self, args, scen, mode, tls, seed, workdir):
        self.args, self.scen, self.mode, self.tls = args, scen, mode, tls
        self.seed = seed
        self.rng = random.Random(seed)
        self.workdir = workdir
        self.tag = "%s-%s-%s-%d" % (scen, mode, tls, seed)
        self.v = []  # violations
        self.reports = []  # the faulted transfers' reports (--json)
        self.stats = {"ok": 0, "failed": 0, "late_ms": 0.0, "mid": 0,
                      "fifo_lost": 0, "fifo_retired": 0}
        self.notes = []  # known limits met (printed, not violations)
        self.peers = []
        self.deadp = XFER_TO if mode == "write" else DEFER_TO

    def bad(self, msg):
        self.v.append(msg)

    def spawn(self, side, inst):
        pr = Peer(self.args, side, inst, self.mode, self.tls, self.ports,
                  self.workdir, self.tag)
        self.peers.append(pr)
        r = pr.wait_for(lambda x: x.get("ev") in ("ready", "fatal"),
                        now() + 30)
        if r is None or r["ev"] != "ready":
            self.bad("%s%d did not start: %s" % (side, inst, r))
            return None
        return pr

    def xfer_result(self, pr, tid, deadline):
        return pr.wait_for(lambda x: x.get("ev") == "xfer" and
                           x.get("tid") == tid, deadline)

    def p_request(self, P, tid, gen):
        P.send("REQ %s %d %d" % (tid, gen, NBLOCKS))
        r = P.wait_for(lambda x: (x.get("ev") == "params" and
                                  x.get("tid") == tid) or
                       (x.get("ev") == "xfer" and x.get("tid") == tid),
                       now() + 10)
        if r is None or r["ev"] != "params":
            self.bad("P producer_request %s: %s" % (tid, r))
            return None
        return json.dumps(r["params"], separators=(",", ":"))

    def start_pair(self, P, D, tid, gen):
        """Both sides' requests of transfer gen. WRITE: D allocates first
        (P's layer_ready pacing, the simulated prefill, starts when P's
        request is made, so the fault meets the puts in flight)."""
        if self.mode == "write":
            D.send("REQ %s %d %d {}" % (tid, gen, NBLOCKS))
            if D.wait_for(lambda x: x.get("tid") == tid and
                          x.get("ev") in ("started", "xfer"),
                          now() + 10) is None:
                self.bad("D consumer_request %s: no answer" % tid)
                return False
            return self.p_request(P, tid, gen) is not None
        params = self.p_request(P, tid, gen)
        if params is None:
            return False
        D.send("REQ %s %d %d %s" % (tid, gen, NBLOCKS, params))
        return True

    def clean_transfer(self, P, D, gen, what, fifo_lost_ok=False):
        """A transfer without fault: both sides must report OK. With
        fifo_lost_ok (shared memory after a process was killed, see
        SM_FIFO_LIMIT), a failure both sides report, with a reason, is
        counted as that known limit instead; an OK must still be exact."""
        tid = "t%d-%d" % (self.seed, gen)
        if not self.start_pair(P, D, tid, gen):
            return
        end = now() + HS_TO + XFER_TO + DEFER_TO + 8
        d = self.xfer_result(D, tid, end)
        p = self.xfer_result(P, tid, end)
        lost = fifo_lost_ok and d is not None and p is not None and \
            (d["outcome"] != "ok" or p["outcome"] != "ok") and \
            all(r["outcome"] == "ok" or r.get("reason") for r in (d, p))
        if lost:
            self.stats["fifo_lost"] += 1
            self.notes.append("known limit (%s): %s transfer %s: D %s (%s), "
                              "P %s (%s)" % (
                                  SM_FIFO_LIMIT, what, tid, d["outcome"],
                                  d.get("reason"), p["outcome"],
                                  p.get("reason")))
        for side, r in (("D", d), ("P", p)):
            if lost and r["outcome"] != "ok":
                continue  # reported, with its reason: the known limit
            if r is None or r["outcome"] != "ok":
                self.bad("%s transfer %s on %s: %s" % (
                    what, tid, side, r and {k: r.get(k) for k in (
                        "outcome", "status", "reason", "event")}))
        if d is not None and d["outcome"] == "ok" and d["wrong_bytes"] != 0:
            self.bad("%s transfer %s reported OK with %d wrong bytes" % (
                what, tid, d["wrong_bytes"]))

    def check_report(self, side, r, base, dead, tid, allow_ok=True):
        """A fault's transfer on one side: reported in time, right blocks,
        OK only with right bytes."""
        self.reports.append({
            "side": side, "tid": tid, "deadline_s": dead,
            "outcome": r and r["outcome"], "status": r and r.get("status"),
            "reason": r and r.get("reason"), "blocks": r and r.get("blocks"),
            "blocks_match": r and r.get("blocks_match"),
            "wrong_bytes": r and r.get("wrong_bytes"),
            "fault_to_report_s": r and round(r["t_end"] - base, 3)})
        if r is None:
            self.bad("%s: no report of %s within %d s + 1 s of the fault "
                     "(watched until + 4 s)" % (side, tid, dead))
            return
        lat = r["t_end"] - base
        if r["outcome"] == "ok":
            self.stats["ok"] += 1
            if r.get("wrong_bytes", 0) > 0:
                self.bad("%s: %s reported OK with %d wrong bytes (%s; wrong "
                         "K/V units per layer %s, the first holds %s)" % (
                             side, tid, r["wrong_bytes"], self.scen,
                             r.get("wrong_units_per_layer"),
                             r.get("first_wrong_unit_holds")))
            if not allow_ok:
                self.bad("%s: %s reported OK after %s" % (side, tid,
                                                          self.scen))
        elif r["outcome"] == "failed":
            self.stats["failed"] += 1
            self.stats["late_ms"] = max(self.stats["late_ms"], lat * 1e3)
            if lat > dead + 1:
                self.bad("%s: %s failure reported %.2f s after the fault "
                         "(deadline %d s + 1 s): %s %s" % (
                             side, tid, lat, dead, r["status"],
                             r["reason"]))
            if not r.get("blocks_match"):
                self.bad("%s: %s failure lists blocks %s, not %s" % (
                    side, tid, r.get("blocks"), r.get("expected_blocks")))
        elif r["outcome"] != "destroyed":
            self.bad("%s: %s outcome %s (%s)" % (side, tid, r["outcome"],
                                                 r.get("error", "")))

    def run(self):
        try:
            self._run()
        finally:
            for pr in self.peers:
                if pr.alive():
                    try:
                        pr.p.send_signal(signal.SIGCONT)
                    except OSError:
                        pass
            self.collect_exits()
        return self.v

    def _run(self):
        self.ports = free_ports(self.rng, *self.args.port_range)
        P = self.spawn("p", 0)
        D = self.spawn("d", 0)
        if P is None or D is None:
            return
        self.P, self.D = P, D
        self.clean_transfer(P, D, 1, "warm-up")
        if self.scen == SELFTEST:
            seen = any("wrong bytes" in x for x in self.v)
            self.v = [] if seen else [
                "self-test: D flipped a bit of an OK transfer and the check "
                "did not report it"]
            return
        if self.v:
            return
        scen, mode = self.scen, self.mode
        side = scen[-1]
        action = scen.split("_")[0]
        layer = self.rng.randrange(0, LAYERS // 2)
        gen = 2
        tid = "t%d-%d" % (self.seed, gen)
        orphan = None
        if scen == "restart_p":  # a second transfer the old P promised
            orphan = ("t%d-3" % self.seed,
                      self.p_request(P, "t%d-3" % self.seed, 3))
        armed = side == "d" and action in ("abort", "destroy")
        if armed and mode == "read":
            D.send("ARM %s %d" % (action, layer))
        if not self.start_pair(P, D, tid, gen):
            return
        # The fault's moment. READ: D reports layer `layer` landed. WRITE
        # (D's layers land together with write_done): P called layer_ready
        # of `layer`, whose puts then start.
        lev, watch = ("layer", D) if mode == "read" else ("layer_ready", P)
        trig = watch.wait_for(lambda x: (x.get("ev") == lev and
                                         x.get("tid") == tid and
                                         x.get("layer") == layer) or
                              (x.get("ev") == "xfer" and x.get("tid") == tid),
                              now() + HS_TO + XFER_TO + 8)
        if trig is None or trig["ev"] != lev:
            self.bad("fault transfer %s never reached layer %d: %s" % (
                tid, layer, trig))
            return
        victim = P if side == "p" else D
        t_fault = now()
        if action in ("kill", "restart"):
            victim.expect_signal = signal.SIGKILL
            victim.p.send_signal(signal.SIGKILL)
        elif action == "stop":
            victim.p.send_signal(signal.SIGSTOP)
            pause = self.rng.uniform(0.2, 1.5 * XFER_TO)
            time.sleep(pause)  # the fault itself: how long the peer is frozen
            victim.p.send_signal(signal.SIGCONT)
            victim.stopped_until = now()
        elif action == "destroy" and side == "p":
            victim.send("DESTROY")
        elif armed:
            if mode == "write":
                D.p.send_signal(signal.SIGUSR1 if action == "abort"
                                else signal.SIGUSR2)
            f = D.wait_for(lambda x: x.get("ev") == "fault", now() + 10)
            if f is None:
                self.bad("D did not perform the armed %s" % action)
                return
            t_fault = f["t"]
        if action in ("kill", "restart"):
            try:
                victim.p.wait(10)
            except subprocess.TimeoutExpired:
                self.bad("killed %s did not exit" % side)
                return
        if action == "restart":
            new = self.spawn(side, 1)
            if new is None:
                return
            if side == "p":
                P = new
            else:
                D = new
        # Reports of the faulted transfer by the sides still alive.
        survivors = []
        if not (side == "d" and action in ("kill", "restart", "destroy")):
            # A peer that died must be noticed promptly (transfer_timeout);
            # a peer that was only frozen leaves D its own deadline (WRITE:
            # defer_timeout + transfer_timeout, P may still be computing).
            survivors.append(("D", self.D, XFER_TO + (
                DEFER_TO if action == "stop" and mode == "write" else 0)))
        if not (side == "p" and action in ("kill", "restart", "destroy")):
            survivors.append(("P", self.P, self.deadp))
        for name, pr, dead in survivors:
            # Counted from the fault, or from SIGCONT of a frozen peer.
            base = max(t_fault, self.P.stopped_until, self.D.stopped_until)
            r = self.xfer_result(pr, tid, base + dead + 4)
            self.check_report(name, r, base, dead, tid)
            if r is not None and r["t_end"] > t_fault + 0.001 and \
                    name == "D":
                self.stats["mid"] += 1
        if orphan is not None and orphan[1] is not None:
            # READ: served by a P instance that never heard of it; WRITE: P
            # that will never push it. Must fail, never OK with wrong bytes.
            otid, oparams = orphan
            D.send("REQ %s %d %d %s" % (otid, 3, NBLOCKS, oparams))
            t0 = now()
            dead = HS_TO + XFER_TO + (DEFER_TO if mode == "write" else 0)
            r = self.xfer_result(D, otid, t0 + dead + 4)
            self.check_report("D", r, t0, dead, otid, allow_ok=False)
        alive_both = P.alive() and D.alive() and action != "destroy" and \
            action != "kill"
        if alive_both:
            self.clean_transfer(P, D, 4, "after-fault", fifo_lost_ok=(
                self.tls == "sm" and action == "restart" and
                self.args.allow_sm_fifo_loss))
        # Nothing pinned, nothing written after free.
        for pr in (P, D):
            if not pr.alive():
                continue
            pr.send("CHECK")
            pr.send("STATS")
            s = pr.wait_for(lambda x: x.get("ev") == "stats", now() + 10)
            if s is None:
                self.bad("%s%d: no stats" % (pr.side, pr.inst))
            elif s["stats"] is not None:
                if pr.side == "p" and (s["stats"].get("transfers", 0) != 0 or
                                       s["unreported"] != 0):
                    self.bad("P%d: blocks pinned at the end: engine holds %s "
                             "transfers, %d never reported free" % (
                                 pr.inst, s["stats"].get("transfers"),
                                 s["unreported"]))
        for pr in self.peers:
            for c in pr.find(lambda x: x.get("ev") == "check" and
                             x.get("late_bytes", 0) != 0):
                self.bad("D%d: %d bytes written into free blocks %s (seen %s)"
                         % (pr.inst, c["late_bytes"], c["late_blocks"],
                            c["when"]))
            for c in pr.find(lambda x: x.get("ev") == "fatal" or
                             x.get("outcome") == "unknown_event"):
                self.bad("%s%d: %s" % (pr.side, pr.inst, c))

    def collect_exits(self):
        for pr in self.peers:
            rc = pr.finish(now() + 10)
            # engine_destroy: bounded by the in-flight operations' own
            # deadline (transfer_timeout) + 1 s, whatever the peer does.
            for d in pr.find(lambda x: x.get("ev") == "destroyed"):
                if d["ms"] > (XFER_TO + 1) * 1e3:
                    self.bad("%s%d: engine_destroy (%s) took %.0f ms (bound "
                             "transfer_timeout + 1 s)" % (
                                 pr.side, pr.inst, d["why"], d["ms"]))
            self.stats["fifo_retired"] += pr.fifo_retirements()
            want = -int(pr.expect_signal) if pr.expect_signal else 0
            if rc == "hang":
                self.bad("%s%d did not exit within 10 s of QUIT (killed)" % (
                    pr.side, pr.inst))
            elif rc != want:
                what = ("signal %s" % signal.Signals(-rc).name) if \
                    isinstance(rc, int) and rc < 0 else "exit %s" % rc
                self.bad("%s%d crashed: %s (expected %s); stderr: %s" % (
                    pr.side, pr.inst, what, "SIGKILL" if want else "exit 0",
                    pr.stderr_problems() or "see " + pr.errpath))
            else:
                probs = pr.stderr_problems()
                if probs:
                    self.bad("%s%d stderr: %s" % (pr.side, pr.inst, probs))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peer", required=True, help="kvx_faultpeer binary")
    ap.add_argument("--lib", help="libkvxfer.so to dlopen")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--seed", type=int, help="campaign seed (default: random)")
    ap.add_argument("--round-seed", type=int,
                    help="replay one round (with one scenario/mode/tls)")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--tls", default=",".join(TLS))
    ap.add_argument("--max-life", type=int, default=120)
    ap.add_argument("--strict-sm", action="store_true",
                    help="(the default since the receive-FIFO watchdog; "
                    "kept for old command lines)")
    ap.add_argument("--allow-sm-fifo-loss", action="store_true",
                    help="for builds without the receive-FIFO watchdog: "
                    "a transfer after a restart over shared memory may fail "
                    "when both sides report it (SM_FIFO_LIMIT)")
    ap.add_argument("--keep", help="directory for the peers' logs")
    ap.add_argument("--json", help="append one JSON line per round: "
                    "scenario, seed, violations, every report of a faulted "
                    "transfer (status, reason, blocks, fault to report)")
    ap.add_argument("--port-range", default="23000-31000",
                    help="LO-HI: ports of the peers (disjoint ranges for "
                    "campaigns run side by side)")
    args = ap.parse_args()
    try:
        args.port_range = [int(x) for x in args.port_range.split("-")]
        assert len(args.port_range) == 2 and \
            1024 <= args.port_range[0] < args.port_range[1] - 8 <= 65535
    except (ValueError, AssertionError):
        ap.error("--port-range: '%s': want LO-HI, 1024 <= LO < HI - 8" %
                 args.port_range)
    args.peer = os.path.abspath(args.peer)
    if args.lib:
        args.lib = os.path.abspath(args.lib)
    scens = [s for s in args.scenarios.split(",") if s]
    args.corrupt = scens == [SELFTEST]
    for s in scens:
        if s not in SCENARIOS and not args.corrupt:
            ap.error("--scenarios: '%s' is not one of %s" % (
                s, ",".join(SCENARIOS)))
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    print("faultrun: campaign seed %d (replay: --seed %d)" % (seed, seed),
          flush=True)
    workdir = args.keep or tempfile.mkdtemp(prefix="kvx-fault-")
    os.makedirs(workdir, exist_ok=True)
    print("faultrun: peer logs in %s" % workdir, flush=True)
    rng = random.Random(seed)
    table, failures = [], []
    me = os.path.abspath(sys.argv[0])
    for scen in scens:
        for mode in args.modes.split(","):
            for tls in args.tls.split(","):
                row = {"n": 0, "pass": 0, "ok": 0, "failed": 0, "late": 0.0,
                       "mid": 0, "fifo_lost": 0, "fifo_retired": 0,
                       "seeds": []}
                for i in range(args.rounds):
                    rs = args.round_seed if args.round_seed is not None \
                        else rng.randrange(1 << 30)
                    t0 = now()
                    rd = Round(args, scen, mode, tls, rs, workdir)
                    v = rd.run()
                    row["n"] += 1
                    row["ok"] += rd.stats["ok"]
                    row["failed"] += rd.stats["failed"]
                    row["mid"] += rd.stats["mid"]
                    row["fifo_lost"] += rd.stats["fifo_lost"]
                    row["fifo_retired"] += rd.stats["fifo_retired"]
                    row["late"] = max(row["late"], rd.stats["late_ms"])
                    replay = ("/usr/bin/python3 %s --peer %s%s --scenarios %s "
                              "--modes %s --tls %s --round-seed %d" % (
                                  me, args.peer,
                                  " --lib " + args.lib if args.lib else "",
                                  scen, mode, tls, rs))
                    if args.json:
                        with open(args.json, "a") as jf:
                            jf.write(json.dumps({
                                "scenario": scen, "mode": mode, "tls": tls,
                                "round_seed": rs, "campaign_seed": seed,
                                "violations": v, "reports": rd.reports,
                                "replay": replay}) + "\n")
                    state = "PASS" if not v else "FAIL"
                    print("%s %-9s %-5s %-3s round %d seed %d (%.1f s)" % (
                        state, scen, mode, tls, i + 1, rs, now() - t0),
                        flush=True)
                    for x in rd.notes:
                        print("    note: " + x, flush=True)
                    if v:
                        row["seeds"].append(rs)
                        failures.append((scen, mode, tls, rs, v, replay))
                        for x in v:
                            print("    - " + x, flush=True)
                        print("    replay: " + replay, flush=True)
                    else:
                        row["pass"] += 1
                table.append((scen, mode, tls, row))
    print("\n%-9s %-5s %-3s %6s %6s %8s %8s %12s  %s" % (
        "scenario", "mode", "tls", "rounds", "passed", "fault_ok",
        "fault_fail", "max_fail_ms", "failing seeds"))
    for scen, mode, tls, r in table:
        print("%-9s %-5s %-3s %6d %6d %8d %8d %12.0f  %s" % (
            scen, mode, tls, r["n"], r["pass"], r["ok"], r["failed"],
            r["late"], ",".join(map(str, r["seeds"][:5])) or "-"))
    nfail = sum(r["n"] - r["pass"] for _, _, _, r in table)
    nlost = sum(r["fifo_lost"] for _, _, _, r in table)
    nret = sum(r["fifo_retired"] for _, _, _, r in table)
    if nret:
        print("\nfaultrun: %d workers retired by the receive-FIFO watchdog "
              "(a killed peer blocked a shared-memory FIFO; %s)" % (
                  nret, ", ".join("%s %s %s: %d" % (sc, mo, tl,
                                                   r["fifo_retired"])
                                  for sc, mo, tl, r in table
                                  if r["fifo_retired"])))
    if nlost:
        print("\nfaultrun: %d after-restart transfers failed on shared "
              "memory, reported in time on both sides (%s)" % (
                  nlost, SM_FIFO_LIMIT))
    print("\nfaultrun: %d rounds, %d failed (campaign seed %d)" % (
        sum(r["n"] for _, _, _, r in table), nfail, seed))
    if nfail:
        print("faultrun: peer logs kept in %s" % workdir)
    elif not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if nfail else 0


if __name__ == "__main__":
    sys.exit(main())
