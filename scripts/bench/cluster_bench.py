"""Shared-store benchmark: checkpoints saved by "node A" and loaded by "node
B" through two client mounts of one GlusterFS volume, straight into the
volume and through ckptfs on it, in one run, the targets interleaved round
by round. Prints JSON: medians, ratios of the medians, paired ratios (the
median over rounds of each round's ratio) and their ranges.

  cluster_bench.py --ckptfs BIN --node-a DIR --node-b DIR --work DIR
                   [--model-mb 1000] [--runs 3]

Targets (each in its own folder of the volume):
  gluster        torch.save straight into the volume
  ckptfs         ckptfs on the volume, default options (staging=auto: the
                 raw bytes stay on node A's local disk)
  ckptfs-store   ckptfs with staging=store (raw bytes staged in the volume)

Round k saves version k of one training run (a model + Adam checkpoint, one
more optimizer step per version) into step-k/ckpt.pt, like a trainer; node
A's mounts stay up for the whole run, as a trainer's node keeps its own.
Measured per target and round:
  save_s       torch.save into an open file, then fsync, until close(): the
               save is durable (straight) or committed to the store (ckptfs
               with local staging: fsync commits)
  committed_s  save_s plus the wait until the daemon has nothing pending
                (equals save_s straight into the volume)
  load_s       torch.load through node B (ckptfs: a fresh daemon there)
                after dropping the page cache
  stored_bytes what the version occupies in the volume
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

import torch

from fs_bench import drop_caches


class Target:
    def __init__(self, name, args, options=None, ckptfs=True):
        self.name = name
        self.ckptfs = args.ckptfs if ckptfs else None
        self.options = options
        self.store = f"bench-{name}"
        self.backing = {n: os.path.join(root, self.store) for n, root in (("a", args.node_a), ("b", args.node_b))}
        os.makedirs(self.backing["a"], exist_ok=True)
        self.mnt = {n: os.path.join(args.work, name, f"mnt-{n}") for n in "ab"}
        for m in self.mnt.values():
            os.makedirs(m, exist_ok=True)

    def dir(self, node):
        return self.mnt[node] if self.ckptfs else self.backing[node]

    def mount(self, node):
        if self.ckptfs:
            cmd = [self.ckptfs, "mount", self.backing[node], self.mnt[node]]
            if self.options:
                cmd += ["-o", self.options]
            subprocess.run(cmd, check=True)

    def umount(self, node):
        if self.ckptfs:
            subprocess.run([self.ckptfs, "umount", self.mnt[node]], check=True)

    def wait_committed(self, node):
        if not self.ckptfs:
            return
        while int(os.getxattr(self.mnt[node], "user.ckptfs.pending").decode() or 0) > 0:
            time.sleep(0.005)

    def stored_bytes(self, node, rel):
        path = os.path.join(self.dir(node), rel)
        if not self.ckptfs:
            return os.path.getsize(path)
        return int(os.getxattr(path, "user.ckptfs.stored_bytes").decode())


class TrainingRun:
    """Versions of one model + Adam checkpoint, one optimizer step apart."""

    def __init__(self, model_mb):
        torch.manual_seed(0)
        params = int(model_mb * 1e6 / 4 / 3)
        width = 2048
        layers = max(1, params // (width * width))
        self.model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-3)
        self.step = 0

    def next_version(self):
        self.model(torch.randn(4, self.model[0].in_features)).square().mean().backward()
        self.opt.step()
        self.opt.zero_grad()
        self.step += 1
        return {"model": self.model.state_dict(), "optimizer": self.opt.state_dict(), "step": self.step}


def save_round(t, k, ckpt, r, info):
    # Node A keeps its mount from round to round, as a trainer's node does
    # for the whole run (main mounts and unmounts it).
    rel = os.path.join(f"step-{k}", "ckpt.pt")
    os.makedirs(os.path.join(t.dir("a"), f"step-{k}"), exist_ok=True)
    path = os.path.join(t.dir("a"), rel)
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        torch.save(ckpt, f)
        f.flush()
        os.fsync(f.fileno())
    r["save_s"].append(time.perf_counter() - t0)
    t.wait_committed("a")
    r["committed_s"].append(time.perf_counter() - t0)
    r["stored_bytes"].append(t.stored_bytes("a", rel))
    info["logical_bytes"] = os.path.getsize(path)
    drop_caches()
    t.mount("b")
    try:
        t0 = time.perf_counter()
        loaded = torch.load(os.path.join(t.dir("b"), rel))
        r["load_s"].append(time.perf_counter() - t0)
        del loaded
    finally:
        t.umount("b")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckptfs", required=True)
    ap.add_argument("--node-a", required=True)
    ap.add_argument("--node-b", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--model-mb", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(2)
    targets = [
        Target("gluster", args, ckptfs=False),
        Target("ckptfs", args),
        Target("ckptfs-store", args, "staging=store"),
    ]
    keys = ("save_s", "committed_s", "load_s", "stored_bytes")
    runs = {t.name: {k: [] for k in keys} for t in targets}
    info = {t.name: {} for t in targets}
    run = TrainingRun(args.model_mb)
    try:
        for t in targets:
            t.mount("a")
        for k in range(args.runs):
            ckpt = run.next_version()
            # Rotated order: the host's drift lands on every target alike.
            shift = k % len(targets)
            for t in targets[shift:] + targets[:shift]:
                save_round(t, k, ckpt, runs[t.name], info[t.name])
    finally:
        for t in targets:
            if t.ckptfs and os.path.ismount(t.mnt["a"]):
                subprocess.run([t.ckptfs, "umount", t.mnt["a"]], capture_output=True)
            for n in "ab":
                subprocess.run(["fusermount3", "-uz", t.mnt[n]], capture_output=True)
    timed = ("save_s", "committed_s", "load_s")

    def med(name, key, rounds=None):
        v = runs[name][key] if rounds is None else [runs[name][key][i] for i in rounds]
        return statistics.median(v) if v else None

    def paired(a, b, key):
        r = [x / y for x, y in zip(runs[a][key], runs[b][key]) if y]
        return {"median": statistics.median(r), "range": [min(r), max(r)]}

    out = {
        "checkpoint_bytes": info["gluster"].get("logical_bytes"),
        "runs": args.runs,
        "page_cache_dropped": drop_caches(),
        "medians": {t.name: {k: med(t.name, k) for k in keys} for t in targets},
        # Round 0 is a key frame; later rounds are deltas of the same run.
        "delta_rounds_medians": {t.name: {k: med(t.name, k, range(1, args.runs)) for k in keys} for t in targets}
        if args.runs > 1 else None,
        "speedup_vs_gluster": {t.name: {k: paired("gluster", t.name, k) for k in timed}
                               for t in targets if t.name != "gluster"},
        "ratio": {t.name: info[t.name]["logical_bytes"] / med(t.name, "stored_bytes") for t in targets},
        "raw": runs,
    }
    print(json.dumps(out, indent=2))
    for t in targets:
        shutil.rmtree(t.backing["a"], ignore_errors=True)
    shutil.rmtree(args.work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
