#!/usr/bin/env python3
"""seeds.py - (re)write the seed part of tests/fuzz/corpus/ from the inputs
of the unit tests: every string literal of tests/unit/test_{config,addr,
ctlmsg,proxy}.cc (adjacent literals joined, C escapes decoded, raw strings
as written), sorted to the targets whose decoders take that kind of text,
plus the layer shapes of test_layout.cc encoded for fuzz_plan.c's input
format. Seed files are named seed-<sha1>; other files (reproducers of
defects, inputs found by fuzzing) are left alone.

Usage: tests/fuzz/seeds.py   (from anywhere)
"""
import codecs, hashlib, os, re, struct, sys

here = os.path.dirname(os.path.abspath(__file__))
unit = os.path.join(here, "..", "unit")
corpus = os.path.join(here, "corpus")

LIT = re.compile(r'R"(?P<d>[^(\s]*)\((?P<raw>.*?)\)(?P=d)"|"(?P<s>(?:[^"\\\n]|\\.)*)"',
                 re.S)


def literals(name):
    text = open(os.path.join(unit, name), encoding="utf-8").read()
    text = re.sub(r"^\s*#include.*$", "", text, flags=re.M)
    text = re.sub(r"//[^\n]*", "", text)
    out, cur, last_end = [], None, None
    for m in LIT.finditer(text):
        if m.group("raw") is not None:
            val = m.group("raw").encode()
        else:
            val = codecs.escape_decode(m.group("s").encode())[0]
        between = text[last_end:m.start()] if last_end is not None else "x"
        if cur is not None and between.strip() == "":
            cur += val
        else:
            if cur is not None:
                out.append(cur)
            cur = val
        last_end = m.end()
    if cur is not None:
        out.append(cur)
    return [v for v in out if v and len(v) <= 8192]


def put(target, data):
    d = os.path.join(corpus, target)
    os.makedirs(d, exist_ok=True)
    name = "seed-" + hashlib.sha1(data).hexdigest()[:16]
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def main():
    for t in ["config", "params", "ctlmsg", "reply", "handshake", "plan",
              "proxy"]:
        d = os.path.join(corpus, t)
        if os.path.isdir(d):
            for f in os.listdir(d):
                if f.startswith("seed-"):
                    os.remove(os.path.join(d, f))
    cfg = literals("test_config.cc")
    for v in cfg:
        if v.lstrip().startswith(b"{"):
            put("config", v)
            put("proxy", b"\x01\x05" + v)
    for v in literals("test_addr.cc"):
        s = v.lstrip()
        if s.startswith(b"{"):
            put("params", b"\x00" + v)
        elif b"___" in v:
            put("params", b"\x02" + v)
        elif b"host:" in v or b"handshake:" in v:
            put("params", b"\x01" + v)
        else:
            put("params", b"\x03" + v)
    for v in literals("test_ctlmsg.cc"):
        put("ctlmsg", v)
        if v.lstrip().startswith(b"{") or v.lstrip().startswith(b'"'):
            put("reply", v)
        if b"get_meta" in v or b"layers" in v:
            put("handshake", v)
        if re.fullmatch(rb"[A-Za-z0-9+/=]*", v):
            put("handshake", v)
    for v in literals("test_pval.cc"):  # the flat reader's cases
        if v.lstrip().startswith(b"{"):
            put("params", b"\x00" + v)
            put("ctlmsg", v)
    for v in literals("test_proxy.cc"):
        if v.lstrip().startswith(b"{"):
            put("proxy", b"\x00\x05" + v)
            put("params", b"\x00" + v)
    # fuzz_plan.c input: flags, then a description (flags byte, shape u16
    # each, sizes), remote num_blocks u16, region slack, slice a, b,
    # nlocal, extra remote, ids (u8 each).
    def desc(ndim_flag, shape, elem, bs, heads, hd, hdv, key_only=0):
        b = bytes([ndim_flag | (key_only << 2) | 64])  # u16 block_size
        for x in shape:
            b += struct.pack(">H", x)
        b += bytes([elem]) + struct.pack(">HHHH", bs, heads, hd, hdv)
        return b + b"\x00"  # length slack
    shapes = [  # the layouts of test_layout.cc (ndim flag: 0=3, 1=4, 2=5)
        (2, [2, 8, 16, 4, 8], 2, 16, 4, 8, 0, 0),   # split [2,NB,BS,H,D]
        (2, [2, 8, 4, 16, 8], 2, 16, 4, 8, 0, 0),   # split heads-first
        (2, [8, 2, 16, 4, 8], 2, 16, 4, 8, 0, 0),   # interleaved
        (2, [8, 2, 4, 16, 8], 2, 16, 4, 8, 0, 0),   # interleaved heads-first
        (0, [8, 16, 64], 2, 16, 0, 64, 0, 1),       # key-only (MLA)
        (1, [8, 4, 16, 24], 2, 16, 4, 16, 8, 0),    # packed K+V
        (2, [2, 32, 4, 4, 8], 2, 16, 4, 8, 0, 0),   # split kernel blocks
    ]
    for nd, shape, elem, bs, h, hd, hdv, ko in shapes:
        d = desc(nd, shape, elem, bs, h, hd, hdv, ko)
        ids = bytes([3, 1, 2, 5, 6, 7])
        for mode in (0x00, 0x10, 0x20):
            tail = struct.pack(">H", 8) + b"\x00" + bytes([0, 2, 3, 0]) + ids
            put("plan", bytes([mode]) + d + tail)
            put("plan", bytes([mode | 1]) + d + d + bytes([0, 2, 3, 0]) + ids)
    return 0


if __name__ == "__main__":
    sys.exit(main())
