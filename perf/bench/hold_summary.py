#!/usr/bin/env python3
"""hold_summary.py - completion rate with and without idle transfers.

Reads the CSV rows (`kvxfer_perf -f csv`, one or more runs appended to one
file; repeated headers are fine) of two series, HELD (runs with --hold N)
and NONE (the same command with --hold 0), and prints the transfers per
second of each (min / median / max over the runs) and the ratio HELD/NONE
taken run by run in the order the runs were made (pair k = k-th run of each
file; run them alternately, A B A B, so a pair shares the machine's state).

    hold_summary.py [--skip K] HELD.csv NONE.csv

--skip K drops the first K runs of each file (warm-up runs). With several
rows per run (sweeps), each row index is summarised separately.
"""
import csv
import statistics
import sys


def runs(path):
    """List of runs; a run is the list of its data rows (dicts)."""
    out, header = [], None
    with open(path, newline="") as f:
        for rec in csv.reader(f):
            if not rec:
                continue
            if rec[0] == "mode":
                header = rec
                out.append([])
            elif header is not None and len(rec) == len(header):
                out[-1].append(dict(zip(header, rec)))
    return [r for r in out if r]


def mmm(v):
    return "%.1f / %.1f / %.1f" % (min(v), statistics.median(v), max(v))


def main(argv):
    skip = 0
    if len(argv) >= 2 and argv[0] == "--skip":
        skip = int(argv[1])
        argv = argv[2:]
    if len(argv) != 2:
        sys.exit(__doc__)
    held, none = runs(argv[0])[skip:], runs(argv[1])[skip:]
    if not held or not none:
        sys.exit("hold_summary: no complete runs in %s" %
                 (argv[0] if not held else argv[1]))
    nrows = min(len(r) for r in held + none)
    for i in range(nrows):
        a = [float(r[i]["xfers_per_s"]) for r in held]
        b = [float(r[i]["xfers_per_s"]) for r in none]
        ratio = [x / y for x, y in zip(a, b) if y > 0]
        r0, n0 = held[0][i], none[0][i]
        print("%s %s batch %s, %s runs: transfers/s min / median / max"
              % (r0["mode"], r0["tls"], r0["batch"], len(a)))
        print("  hold %-8s %s  (holds created in %s s, P held %s after "
              "the point)" % (r0["hold"], mmm(a),
                              "/".join("%.1f" % float(r[i]["hold_create_s"])
                                       for r in held),
                              r0["p_transfers_end"]))
        print("  hold %-8s %s" % (n0["hold"], mmm(b)))
        print("  ratio (pair by pair, %d pairs): %s" % (
            len(ratio), "%.4f / %.4f / %.4f" % (min(ratio),
                                                statistics.median(ratio),
                                                max(ratio))))


if __name__ == "__main__":
    main(sys.argv[1:])
