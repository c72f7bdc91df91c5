"""A training run's saves through two ckptfs builds, side by side: for each
round and each build (alternated within the round), a fresh mount, then
the versions of one run (a stack of 2048x2048 linear layers + Adam, one
optimizer step apart, as sequence.sh makes them) saved with torch.save into
step-K/ckpt.pt, each waited for until nothing is pending. Measured per
build and round: each version's save and committed time, the wall time of
the whole loop (training steps included), the trainer's CPU time over the
loop and the daemon's CPU time until a few seconds after the last commit
(its background work, such as keeping the reconstruction, included). The
CPU times show what a change costs the machine a trainer shares with the
daemon, which the committed times of a quiet benchmark do not.

  run_ab.py --a BIN --b BIN [--model-mb 600] [--versions 4] [--runs 3] [--work DIR]

Needs root and /dev/fuse. Prints JSON: per build the rounds and the medians
of their totals. For one change's before and after; the benchmarks of
record are codec.sh, fs.sh, sequence.sh and cluster.sh.
"""
import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster_bench import TrainingRun  # noqa: E402


def daemon_pid(mnt):
    out = subprocess.run(["pgrep", "-n", "-f", f"ckptfs.* mount .* {mnt}$"], capture_output=True, text=True)
    if out.returncode != 0:
        out = subprocess.run(["pgrep", "-n", "-f", f" {mnt}$"], capture_output=True, text=True)
    return int(out.stdout.split()[0])


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_round(binary, work, model_mb, versions, settle_s):
    backing, mnt = os.path.join(work, "backing"), os.path.join(work, "mnt")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(backing)
    os.makedirs(mnt)
    subprocess.run([binary, "mount", backing, mnt], check=True)
    try:
        pid = daemon_pid(mnt)
        run = TrainingRun(model_mb)
        usage = resource.getrusage(resource.RUSAGE_SELF)
        cpu0, t0 = usage.ru_utime + usage.ru_stime, time.perf_counter()
        r = {"save_s": [], "committed_s": []}
        for k in range(versions):
            ckpt = run.next_version()
            os.makedirs(os.path.join(mnt, f"step-{k}"), exist_ok=True)
            start = time.perf_counter()
            torch.save(ckpt, os.path.join(mnt, f"step-{k}", "ckpt.pt"))
            r["save_s"].append(round(time.perf_counter() - start, 3))
            while int(os.getxattr(mnt, "user.ckptfs.pending").decode() or 0) > 0:
                time.sleep(0.005)
            r["committed_s"].append(round(time.perf_counter() - start, 3))
            del ckpt
        r["wall_s"] = round(time.perf_counter() - t0, 3)
        usage = resource.getrusage(resource.RUSAGE_SELF)
        r["trainer_cpu_s"] = round(usage.ru_utime + usage.ru_stime - cpu0, 2)
        time.sleep(settle_s)
        r["daemon_cpu_s"] = round(cpu_seconds(pid), 2)
        r["total_cpu_s"] = round(r["trainer_cpu_s"] + r["daemon_cpu_s"], 2)
        return r
    finally:
        subprocess.run([binary, "umount", mnt], check=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", required=True)
    ap.add_argument("--b", required=True)
    ap.add_argument("--model-mb", type=int, default=600)
    ap.add_argument("--versions", type=int, default=4)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--settle-s", type=float, default=3.0)
    ap.add_argument("--work")
    args = ap.parse_args()
    torch.set_num_threads(2)
    work = args.work or tempfile.mkdtemp(prefix="ckptfs-run-ab-")
    builds = {"a": os.path.abspath(args.a), "b": os.path.abspath(args.b)}
    rounds = {name: [] for name in builds}
    for _ in range(args.runs):
        for name, binary in builds.items():
            rounds[name].append(one_round(binary, os.path.join(work, name), args.model_mb, args.versions,
                                          args.settle_s))
    result = {"model_mb": args.model_mb, "versions": args.versions, "runs": args.runs}
    for name in builds:
        med = {k: statistics.median(r[k] for r in rounds[name])
               for k in ("wall_s", "trainer_cpu_s", "daemon_cpu_s", "total_cpu_s")}
        med["committed_s"] = statistics.median(sum(r["committed_s"]) for r in rounds[name])
        result[name] = {"binary": builds[name], "rounds": rounds[name], "median": med}
    print(json.dumps(result, indent=1))
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
