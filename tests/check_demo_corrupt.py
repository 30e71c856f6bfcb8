#!/usr/bin/env python3
"""check_demo_corrupt.py DEMO [ARGS...]: the demo's byte check must catch a
flipped byte, and only that byte.

Runs DEMO ARGS --corrupt (D flips one bit of one received byte before it
verifies) and passes only when: the demo exits non-zero; D reports a
MISMATCH at exactly the layer, block, plane and byte it says it flipped, with
got = want ^ 0x01; and the prefill side exited 0 (the transfer itself
worked). Any other failure (a crash, a setup error, a mismatch elsewhere)
fails this test, which a plain should_fail test would have passed.
"""
import re
import subprocess
import sys


def main():
    cmd = sys.argv[1:] + ["--corrupt"]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=110)
    out = p.stdout
    sys.stdout.write(out)
    errors = []
    if p.returncode == 0:
        errors.append("the demo exited 0 with a corrupted byte")
    flip = re.search(r"--corrupt: flipped one bit of layer (\d+) block (\d+) "
                     r"V byte (\d+)", out)
    if flip is None:
        errors.append("no '--corrupt: flipped ...' line: the flip did not run")
    mism = re.findall(r"MISMATCH layer (\d+) block (\d+) (K|V) byte (\d+): "
                      r"got 0x([0-9a-f]{2}) want 0x([0-9a-f]{2})", out)
    if flip is not None:
        want = (flip.group(1), flip.group(2), "V", flip.group(3))
        if [m[:4] for m in mism] != [want]:
            errors.append(f"MISMATCH lines {mism}, want exactly one at "
                          f"layer {want[0]} block {want[1]} V byte {want[3]}")
        elif int(mism[0][4], 16) ^ int(mism[0][5], 16) != 0x01:
            errors.append(f"mismatch got 0x{mism[0][4]} want 0x{mism[0][5]}: "
                          f"not the one flipped bit")
    if not re.search(r"prefill \(pid \d+\): exit 0", out):
        errors.append("the prefill side did not exit 0")
    for e in errors:
        print("check_demo_corrupt: " + e)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
