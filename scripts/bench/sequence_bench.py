"""Sequence benchmark: the versions of one training run saved into one kept
mount, as a trainer does (a folder per step), straight onto the backing
disk, through ckptfs (default options) and through ckptfs with compression
off (passthrough), the targets interleaved version by version. Unlike
fs_bench.py (a fresh key frame per round, remounted), later versions here
are delta frames whose base the daemon wrote itself. Prints JSON.

  sequence_bench.py --ckptfs BIN --work DIR [--model-mb 1000] [--versions 4]

Measured per target and version:
  save_s       torch.save into step-K/ckpt.pt, until close()
  committed_s  from the start of the save until nothing is pending
  load_s       torch.load of that version right after (the same mount: what
               a trainer resuming, or an evaluation job, on that node gets)
  stored_bytes what the version occupies in the backing directory
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch

from cluster_bench import TrainingRun
from fs_bench import Target


def save_version(t, k, ckpt, r):
    rel = os.path.join(f"step-{k}", "ckpt.pt")
    os.makedirs(os.path.join(t.dir, f"step-{k}"), exist_ok=True)
    path = os.path.join(t.dir, rel)
    t0 = time.perf_counter()
    torch.save(ckpt, path)
    r["save_s"].append(time.perf_counter() - t0)
    t.wait_committed()
    r["committed_s"].append(time.perf_counter() - t0)
    r["stored_bytes"].append(t.stored_bytes(path))
    t0 = time.perf_counter()
    loaded = torch.load(path)
    r["load_s"].append(time.perf_counter() - t0)
    del loaded


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckptfs", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--model-mb", type=int, default=1000)
    ap.add_argument("--versions", type=int, default=4)
    args = ap.parse_args()
    torch.set_num_threads(2)
    targets = [Target("disk", args.work), Target("ckptfs", args.work, args.ckptfs),
               Target("passthrough", args.work, args.ckptfs, "compress=off")]
    keys = ("save_s", "committed_s", "load_s", "stored_bytes")
    runs = {t.name: {k: [] for k in keys} for t in targets}
    run = TrainingRun(args.model_mb)
    logical = None
    for t in targets:
        t.mount()
    try:
        for k in range(args.versions):
            ckpt = run.next_version()
            shift = k % len(targets)  # rotated order: the host's drift lands on every target alike
            for t in targets[shift:] + targets[:shift]:
                save_version(t, k, ckpt, runs[t.name])
            logical = os.path.getsize(os.path.join(targets[0].dir, f"step-{k}", "ckpt.pt"))
    finally:
        for t in targets:
            t.umount()

    def med(name, key, versions):
        return statistics.median([runs[name][key][i] for i in versions])

    deltas = range(1, args.versions)
    out = {
        "checkpoint_bytes": logical,
        "versions": args.versions,
        "key_frame": {t.name: {k: runs[t.name][k][0] for k in keys} for t in targets},
        "later_versions_medians": {t.name: {k: med(t.name, k, deltas) for k in keys} for t in targets}
        if args.versions > 1 else None,
        "committed_vs_passthrough_paired": statistics.median(
            [a / b for a, b in zip(runs["ckptfs"]["committed_s"], runs["passthrough"]["committed_s"])]),
        "load_vs_disk_paired": statistics.median(
            [a / b for a, b in zip(runs["ckptfs"]["load_s"], runs["disk"]["load_s"])]),
        "ratio": logical * args.versions / sum(runs["ckptfs"]["stored_bytes"]),
        "raw": runs,
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    sys.exit(main())
