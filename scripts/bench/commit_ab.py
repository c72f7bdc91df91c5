"""Commit time of two ckptfs builds, side by side: for each round and each
build, a fresh mount, a copy of BASE into step-0/ (a key frame; waited for),
then a copy of NEXT into step-1/ (a delta frame against it), then a read
of step-1/ right away. Measured: the time from the end of each copy
(close) until nothing is pending, which is the daemon's work on the file
alone (the copy's own time depends on the page cache more than on
ckptfs), and the read's time. The builds alternate within each round.
Prints JSON: per build the key, delta and read times of every round and
their medians, and the paired ratios (B / A) per round.

  commit_ab.py --a BIN --b BIN --base FILE --next FILE [--runs 5] [--work DIR] [-o OPTIONS]

Needs root and /dev/fuse. Use it for one change's before and after; the
benchmarks of record are codec.sh, fs.sh, sequence.sh and cluster.sh.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def wait_committed(mnt):
    while int(os.getxattr(mnt, "user.ckptfs.pending").decode() or 0) > 0:
        time.sleep(0.002)


def copy_timed(src, mnt, rel):
    dst = os.path.join(mnt, rel)
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    shutil.copyfile(src, dst)
    closed = time.monotonic()
    wait_committed(mnt)
    return time.monotonic() - closed


def one_round(binary, work, base, nxt, options):
    backing, mnt = os.path.join(work, "backing"), os.path.join(work, "mnt")
    for d in (backing, mnt):
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
    cmd = [binary, "mount", backing, mnt] + (["-o", options] if options else [])
    subprocess.run(cmd, check=True)
    try:
        key = copy_timed(base, mnt, "step-0/ckpt.pt")
        delta = copy_timed(nxt, mnt, "step-1/ckpt.pt")
        t0 = time.monotonic()
        with open(os.path.join(mnt, "step-1/ckpt.pt"), "rb") as f:
            while f.read(1 << 20):
                pass
        read = time.monotonic() - t0
        stored = [int(os.getxattr(os.path.join(mnt, f"step-{k}/ckpt.pt"), "user.ckptfs.stored_bytes").decode())
                  for k in (0, 1)]
    finally:
        subprocess.run([binary, "umount", mnt], check=True)
    return key, delta, read, stored


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", required=True, help="the build before")
    ap.add_argument("--b", required=True, help="the build after")
    ap.add_argument("--base", required=True)
    ap.add_argument("--next", required=True)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--work", default=None)
    ap.add_argument("-o", dest="options", default="")
    args = ap.parse_args()
    work = args.work or tempfile.mkdtemp(prefix="ckptfs-commit-ab.")
    builds = {"a": args.a, "b": args.b}
    r = {n: {"key_s": [], "delta_s": [], "read_s": [], "stored_bytes": None} for n in builds}
    try:
        for i in range(args.runs):
            for name, binary in builds.items():
                key, delta, read, stored = one_round(binary, work, args.base, args.next, args.options)
                r[name]["key_s"].append(key)
                r[name]["delta_s"].append(delta)
                r[name]["read_s"].append(read)
                r[name]["stored_bytes"] = stored
                print(f"round {i} {name}: key {key:.2f} s, delta {delta:.2f} s, read {read:.2f} s", file=sys.stderr)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    out = {"a": args.a, "b": args.b, "base": args.base, "next": args.next, "runs": args.runs, "raw": r}
    for what in ("key_s", "delta_s", "read_s"):
        out[f"median_{what}"] = {n: statistics.median(r[n][what]) for n in builds}
        out[f"paired_b_over_a_{what}"] = [b / a for a, b in zip(r["a"][what], r["b"][what])]
    json.dump(out, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
