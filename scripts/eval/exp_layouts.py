#!/usr/bin/python3
"""Experiment (issue #24): the same training run saved in the folder layouts
training frameworks use, each replayed into a fresh ckptfs mount.

  exp_layouts.py [--size full|large|smoke] [--layouts a,b,...] [--workdir DIR]
      [--results DIR] [--mount-opts K=V,...] [--lossy on|off] [--keep-stores]

One run trains once (an MLP on scikit-learn's digits with AdamW and a
cosine schedule; full: 15 checkpoints 100 steps apart, ~6.9 MB of model and
optimizer state each; large: the same with a 2048-wide MLP, ~52 MB each;
smoke: a tiny model, 4 checkpoints). Every
checkpoint's state (model, optimizer, scheduler, RNG, log) is kept in
memory. Each layout then replays the run into a fresh mount (fresh backing
directory), writing the files a framework writes, under its names, in its
order (staging folders renamed, trackers rewritten in place, copies, old
steps deleted), and waits after each save until the daemon has nothing
pending (`user.ckptfs.pending` == 0 on the mount root), as a trainer whose
save interval exceeds the encode time would. Right after that wait, the
virtual xattrs of every file of the save (codec, base, chain_depth, stored
bytes) are recorded, so that files deleted later still count.

Layouts (framework-layouts notes, section 7):
  one-folder       run/ckpt-NNNNNN.pt
  hf-trainer       run/tmp-checkpoint-N/{pytorch_model.bin, optimizer.pt,
                   scheduler.pt, rng_state.pth, trainer_state.json}, then
                   renamed to run/checkpoint-N/
  hf-safetensors   the same with model.safetensors
  megatron         run/iter_NNNNNNN/mp_rank_00/model_optim_rng.pt and
                   run/latest_checkpointed_iteration.txt (rewritten in place)
  megatron-tp2     two ranks, mp_rank_00/ and mp_rank_01/, each half of every
                   tensor (rows) with its optimizer state
  deepspeed        run/global_stepN/mp_rank_00_model_states.pt,
                   zero_pp_rank_{0,1}_mp_rank_00_optim_states.pt (each half of
                   the flattened fp32 optimizer state) and run/latest
  dcp              run/step-N/__{0,1}_0.distcp (each rank's shards, one
                   torch.save zip per chunk, back to back, as
                   torch.distributed.checkpoint's FileSystemWriter writes
                   them) and .metadata (written as .metadata.tmp, renamed)
  lightning        run/checkpoints/epoch=E-step=N.ckpt (top-1: the previous
                   one removed after the save) and last.ckpt (shutil.copy2
                   of the new file); compared with one-folder-keep1
  lightning-all    the same with save_top_k=-1: every epoch=E-step=N.ckpt
                   kept, last.ckpt rewritten as a copy each save
  one-folder-keep1 one-folder, only the newest file kept
  one-folder-keep3 one-folder, the oldest file beyond 3 removed after each save
  hf-trainer-keep3 hf-trainer, the oldest checkpoint-N beyond 3 rmtree'd
  copy             one checkpoint, then shutil.copy2 to another name in the
                   same folder and into another folder: the store's growth

After each layout: unmount (`ckptfs umount`), `ckptfs gc BACKING --grace 0`,
`ckptfs fsck BACKING` (must exit 0), then logical bytes (the retained files'
sizes as the mount showed them), store bytes (`du -s -B1 BACKING`, also the
apparent `du -sb`), ratio = logical / store, and how many versions were
delta frames (a base recorded) or key frames. Reads are verified after a
read-only remount: every retained file is loaded and compared with the
state it was written from: with --lossy off bit for bit; by default each
float tensor within the budget that applies to it (docs/policy.md: weights
`budget`, optimizer state `opt_budget`, Adam's exp_avg on the step or on
itself, exp_avg_sq per element), and the largest relative L2 error is
reported.

Writes RESULTS/layouts.{json,md} (layouts-lossless.* with --lossy off) and prints the JSON.
Exit status 1 when a layout failed, fsck found problems or a read did not
verify (missed compression targets do not fail the run).
"""
import argparse
import copy
import datetime
import io
import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import backends as bk  # noqa: E402
import common  # noqa: E402
import harness as h  # noqa: E402
from framework_layouts import BATCH, LAYOUT_FUNCS, Ctx  # noqa: E402
from layouts_report import summarize, write_outputs  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

SIZES = {
    # hidden width of the 64 -> H -> H -> 10 MLP; full: 0.57 M parameters,
    # 6.9 MB of weights + AdamW moments per checkpoint.
    "full": dict(hidden=720, steps=1500, save_every=100),
    # 4.3 M parameters, 52 MB per checkpoint: where per-file costs (a
    # manifest, a folder, an object's last block) no longer weigh.
    "large": dict(hidden=2048, steps=1500, save_every=100),
    "smoke": dict(hidden=48, steps=40, save_every=10),
}
LAYOUTS = ("one-folder", "hf-trainer", "hf-safetensors", "megatron", "megatron-tp2", "deepspeed", "dcp",
           "lightning", "lightning-all", "one-folder-keep1", "one-folder-keep3", "hf-trainer-keep3", "copy")


# --------------------------------------------------------------------------
# The training run


def train_run(size):
    """Trains the MLP once; returns (run info, [checkpoint state]) with every
    checkpoint's state copied (the live tensors keep changing)."""
    from sklearn.datasets import load_digits
    cfg = SIZES[size]
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    n_train = int(0.8 * len(y))
    steps_per_epoch = math.ceil(n_train / BATCH)
    hidden = cfg["hidden"]
    model = torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden),
                                torch.nn.ReLU(), torch.nn.Linear(hidden, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=cfg["steps"])
    log_history, ckpts = [], []
    t0 = time.time()
    for step in range(1, cfg["steps"] + 1):
        gen = torch.Generator().manual_seed(step)
        idx = torch.randint(0, n_train, (BATCH,), generator=gen)
        loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        if step % max(1, cfg["save_every"] // 10) == 0:
            log_history.append({"epoch": round(step / steps_per_epoch, 4), "learning_rate": sched.get_last_lr()[0],
                                "loss": round(loss.item(), 4), "step": step})
        if step % cfg["save_every"] == 0:
            ckpts.append({
                "step": step,
                "epoch": (step - 1) // steps_per_epoch,
                "model": {k: v.detach().clone() for k, v in model.state_dict().items()},
                "optimizer": copy.deepcopy(opt.state_dict()),
                "scheduler": copy.deepcopy(sched.state_dict()),
                "rng": {"python": random.getstate(), "numpy": np.random.get_state(),
                        "cpu": torch.get_rng_state()},
                "log_history": copy.deepcopy(log_history),
                "loss": loss.item(),
            })
    params = sum(p.numel() for p in model.parameters())
    info = {"model": f"MLP 64-{hidden}-{hidden}-10, AdamW(lr=1e-3, wd=0.01), cosine schedule, digits, batch {BATCH}",
            "hidden": hidden, "parameters": params, "steps": cfg["steps"], "save_every": cfg["save_every"],
            "checkpoints": len(ckpts), "steps_per_epoch": steps_per_epoch,
            "state_bytes_per_checkpoint": params * 4 * 3, "train_seconds": round(time.time() - t0, 1),
            "final_loss": round(ckpts[-1]["loss"], 4)}
    return info, ckpts


# --------------------------------------------------------------------------
# Verifying reads


class Budgets:
    """The default budgets of docs/policy.md, from the mount options."""

    def __init__(self, options):
        kv = dict(o.split("=", 1) for o in options if "=" in o)
        self.weights = float(kv.get("budget", 0.01))
        self.opt = float(kv.get("opt_budget", max(self.weights, 0.2) if self.weights > 0 else 0.0))
        self.momentum = float(kv.get("momentum_budget", min(1.0, 2.5 * self.opt)))
        self.denominator = float(kv.get("denominator_budget", min(1.0, 2 * self.opt)))


class Check:
    """Walks an expected object and the one read back side by side."""
    SLACK = 1.0 + 1e-3  # the codec measures its error in float arithmetic

    def __init__(self, lossless, budgets):
        self.lossless, self.b = lossless, budgets
        self.tensors = self.exact = 0
        self.problems = []
        self.max_rel_l2 = {"weights": 0.0, "optimizer": 0.0, "exp_avg": 0.0, "exp_avg_sq": 0.0}
        self.max_step_rel_l2 = 0.0
        self.max_elem_rel_sq = 0.0

    def problem(self, where, what):
        if len(self.problems) < 20:
            self.problems.append(f"{where}: {what}")

    @staticmethod
    def rel_l2(a, b):
        a, b = a.double(), b.double()
        fin = torch.isfinite(a)
        n = a[fin].norm().item()
        d = (a[fin] - b[fin]).norm().item()
        return d / n if n > 0 else (0.0 if d == 0 else float("inf"))

    def walk(self, x, y, path):
        where = "/".join(str(p) for p in path)
        if torch.is_tensor(x):
            self.tensor(x, y, path, where)
        elif isinstance(x, dict):
            if not isinstance(y, dict) or set(x) != set(y):
                return self.problem(where, "keys differ")
            for k in x:
                if k == "exp_avg" and "exp_avg_sq" in x and torch.is_tensor(x[k]):
                    self.first_moment(x[k], y[k], x["exp_avg_sq"], y["exp_avg_sq"], path + [k])
                else:
                    self.walk(x[k], y[k], path + [k])
        elif isinstance(x, (list, tuple)):
            if type(x) is not type(y) or len(x) != len(y):
                return self.problem(where, "sequence differs")
            for j, (u, v) in enumerate(zip(x, y)):
                self.walk(u, v, path + [j])
        elif isinstance(x, np.ndarray):
            if not (isinstance(y, np.ndarray) and x.dtype == y.dtype and np.array_equal(x, y)):
                self.problem(where, "array differs")
        elif isinstance(x, argparse.Namespace):
            if vars(x) != vars(y):
                self.problem(where, "namespace differs")
        elif x != y and not (isinstance(x, float) and x != x and y != y):
            self.problem(where, f"{x!r} != {y!r}")

    def same_bits(self, x, y):
        if x.dtype != y.dtype or x.shape != y.shape:
            return False
        if x.is_floating_point():
            bits = {8: torch.int64, 4: torch.int32, 2: torch.int16}[x.element_size()]
            return torch.equal(x.contiguous().view(bits), y.contiguous().view(bits))
        return torch.equal(x, y)

    def settled(self, x, y, where):
        """Counts a tensor; True when its check is over (bit-exact, or a
        problem recorded: wrong type, or not bit-exact where it must be)."""
        self.tensors += 1
        if not torch.is_tensor(y) or x.dtype != y.dtype or x.shape != y.shape:
            self.problem(where, "tensor dtype/shape differs")
            return True
        if self.same_bits(x, y):
            self.exact += 1
            return True
        if self.lossless:
            self.problem(where, "not bit-exact")
            return True
        return False

    def tensor(self, x, y, path, where, first_moment=False):
        if self.settled(x, y, where):
            return
        if x.dtype not in (torch.float32, torch.float16, torch.bfloat16) or x.numel() == 0:
            return self.problem(where, "not bit-exact")
        if not torch.equal(torch.isfinite(x), torch.isfinite(y)):
            return self.problem(where, "non-finite elements changed")
        rel = self.rel_l2(x, y)
        names = [str(p) for p in path[1:]]  # path[0] is the file
        leaf = names[-1]
        if leaf == "exp_avg_sq":
            cls = "exp_avg_sq"
        elif first_moment or leaf == "exp_avg":
            cls = "exp_avg"
        elif any("optim" in p or p == "state" for p in names):
            cls = "optimizer"
        else:
            cls = "weights"
        self.max_rel_l2[cls] = max(self.max_rel_l2[cls], rel)
        if cls == "exp_avg_sq":
            # log mode: every element within the per-element bound (an L2
            # budget would let a small element become 0 and the next step
            # divide by eps: docs/policy.md).
            xd, yd = x.double(), y.double()
            elem = ((yd - xd).abs() / xd.abs().clamp_min(1e-300))[xd != 0].max().item() if (xd != 0).any() else 0.0
            self.max_elem_rel_sq = max(self.max_elem_rel_sq, elem)
            if elem > self.b.denominator * self.SLACK:
                self.problem(where, f"exp_avg_sq: per-element rel {elem:.3g} > {self.b.denominator}")
        elif cls == "optimizer":
            if rel > max(self.b.opt, self.b.weights) * self.SLACK:
                self.problem(where, f"rel L2 {rel:.3g} > opt_budget {self.b.opt}")
        elif cls == "weights":
            if rel > self.b.weights * self.SLACK:
                self.problem(where, f"rel L2 {rel:.3g} > budget {self.b.weights}")
        return rel

    def first_moment(self, m, m_hat, v, v_hat, path):
        """Adam's exp_avg: within opt_budget on m, or (step space) within the
        momentum budget on m / (sqrt(v_hat) + eps)."""
        where = "/".join(str(p) for p in path)
        if self.settled(m, m_hat, where):
            return
        rel = self.rel_l2(m, m_hat)
        self.max_rel_l2["exp_avg"] = max(self.max_rel_l2["exp_avg"], rel)
        if rel <= max(self.b.opt, self.b.weights) * self.SLACK:
            return  # within budget on m itself (small tensors are coded on m)
        if not (torch.is_tensor(v_hat) and v_hat.shape == m.shape):
            return self.problem(where, f"exp_avg: rel L2 {rel:.3g} > {self.b.opt} (no exp_avg_sq beside it)")
        denom = v_hat.double().clamp_min(0).sqrt() + 1e-8
        step_rel = self.rel_l2(m.double() / denom, m_hat.double() / denom)
        self.max_step_rel_l2 = max(self.max_step_rel_l2, step_rel)
        if step_rel > self.b.momentum * self.SLACK:
            self.problem(where, f"exp_avg: rel L2 {rel:.3g} > {self.b.opt} and on the step {step_rel:.3g} "
                         f"> {self.b.momentum}")


def nest(items):
    """{'a.b.c': obj} -> {'a': {'b': {'c': obj}}} (DCP items as a state dict)."""
    out = {}
    for fqn, obj in items.items():
        d = out
        parts = fqn.split(".")
        for p in parts[:-1]:
            d = d.setdefault(p, {})
        d[parts[-1]] = obj
    return out


def verify(root, expect, check):
    """Loads every retained file from the mount and compares it."""
    t0, nbytes = time.time(), 0
    for rel in sorted(expect):
        kind, obj = expect[rel]
        path = os.path.join(root, rel)
        nbytes += os.path.getsize(path)
        try:
            if kind == "torch":
                check.walk(obj, torch.load(path), [rel])
            elif kind == "safetensors":
                check.walk(obj, common.load_safetensors(path), [rel])
            elif kind == "bytes":
                with open(path, "rb") as f:
                    if f.read() != obj:
                        check.problem(rel, "bytes differ")
            elif kind == "dcp":
                with open(path, "rb") as f:
                    data = f.read()
                got = {fqn: torch.load(io.BytesIO(data[off:off + n])) for fqn, (off, n, _) in obj.items()}
                check.walk(nest({fqn: o for fqn, (_, _, o) in obj.items()}), nest(got), [rel])
            else:
                raise ValueError(kind)
        except Exception as e:  # a read error or an unloadable file is a finding, not a crash
            check.problem(rel, f"read failed: {e!r}"[:300])
    return {"files": len(expect), "bytes": nbytes, "seconds": round(time.time() - t0, 2)}


# --------------------------------------------------------------------------
# Running one layout


def force_unmount(mnt):
    """fusermount3 -u, then -uz (a mount left by a failure)."""
    if bk.is_mounted(mnt):
        subprocess.run(["fusermount3", "-u", mnt], capture_output=True)
    if bk.is_mounted(mnt):
        subprocess.run(["fusermount3", "-uz", mnt], capture_output=True)


def du(path, *flags):
    r = subprocess.run(["du", "-s", *flags, path], capture_output=True, text=True, check=True)
    return int(r.stdout.split()[0])


def cli(*args, check=True):
    r = subprocess.run([bk.CKPTFS, *args], capture_output=True, text=True, timeout=1800)
    if check and r.returncode != 0:
        raise RuntimeError(f"ckptfs {args[0]} failed ({r.returncode}): {r.stderr.strip()[-2000:]}")
    return r


def retained_sizes(root):
    out = {}
    for d, _, files in os.walk(root):
        for f in files:
            p = os.path.join(d, f)
            out[os.path.relpath(p, root)] = os.path.getsize(p)
    return out


def pattern(rel):
    return re.sub(r"\d+", "N", rel)


def count_versions(versions):
    """Delta vs key frames over the versions stored as blobs (the files the
    daemon parsed or stored as opaque blobs), overall and per path pattern."""
    total = {"versions": 0, "delta": 0, "key": 0}
    per = {}
    for v in versions:
        p = per.setdefault(pattern(v["path"]), {"versions": 0, "delta": 0, "key": 0, "codecs": []})
        p["versions"] += 1
        if v["codec"] and v["codec"] not in p["codecs"]:
            p["codecs"].append(v["codec"])
        if not (v["codec"] or "").startswith("blob:"):
            continue
        kind = "delta" if v["base"] else "key"
        p[kind] += 1
        total["versions"] += 1
        total[kind] += 1
    return total, per


def run_layout(name, ckpts, run, workdir, options, budgets, lossless):
    work = os.path.join(workdir, name)
    shutil.rmtree(work, ignore_errors=True)
    backend = bk.Ckptfs(name, options)
    root = backend.start(workdir)  # WORKDIR/NAME/{backing,mnt,ckptfs.log}
    res = {"status": "ok"}
    t0 = time.time()
    try:
        ctx = Ctx(backend, root)
        if name == "copy":
            res["copy"] = run_copy(ctx, ckpts[-1], work)
        else:
            fn = LAYOUT_FUNCS[name]
            for i, ck in enumerate(ckpts):
                fn(ctx, ck, i, run)
                ctx.commit(ck["step"])
        res["replay_seconds"] = round(time.time() - t0, 1)
        sizes = retained_sizes(root)
        res["retained_files"] = len(sizes)
        res["logical_bytes"] = sum(sizes.values())
        backend.stop()
    finally:
        force_unmount(backend.mnt)
    gc = json.loads(cli("gc", backend.backing, "--grace", "0", "--json").stdout)
    res["gc"] = {k: gc[k] for k in ("removed", "removed_bytes", "live", "problems")}
    f = cli("fsck", backend.backing, "--json", check=False)
    try:
        fj = json.loads(f.stdout)
    except ValueError:
        fj = {"problems": [f.stderr.strip()[-500:]]}
    res["fsck"] = {"exit": f.returncode, "clean": f.returncode == 0, "problems": fj.get("problems", [])[:10]}
    res["store_bytes"] = du(backend.backing, "-B1")
    res["store_apparent_bytes"] = du(backend.backing, "-b")
    res["ratio"] = res["logical_bytes"] / res["store_bytes"]
    total, per = count_versions(ctx.versions)
    res["versions"] = total
    res["version_log"] = ctx.versions
    res["per_file"] = per
    res["uncommitted_versions"] = sum(1 for v in ctx.versions if v["state"] != "committed")
    errs = [float(v["error"]) for v in ctx.versions if v["error"] not in (None, "", "lossless")]
    res["max_error_xattr"] = max(errs) if errs else 0.0
    # Reads after a read-only remount: the bytes come from the store.
    check = Check(lossless, budgets)
    ro = bk.Ckptfs(name, options + ["ro"])
    ro.backing, ro.mnt, ro.log = backend.backing, backend.mnt, backend.log + ".ro"
    try:
        ro._mount()
        res["read"] = verify(ro.mnt, ctx.expect, check)
        ro.stop()
    finally:
        force_unmount(ro.mnt)
    res["read"].update({"tensors": check.tensors, "bit_exact_tensors": check.exact,
                        "max_rel_l2": check.max_rel_l2, "max_step_rel_l2": check.max_step_rel_l2,
                        "max_elem_rel_exp_avg_sq": check.max_elem_rel_sq, "problems": check.problems,
                        "ok": not check.problems, "bit_exact": check.exact == check.tensors and not check.problems})
    if not res["fsck"]["clean"] or not res["read"]["ok"]:
        res["status"] = "problems"
    return res


def run_copy(ctx, ck, work):
    """One checkpoint, then copy2 into the same folder and into another
    folder; the store's growth (du -B1 of the backing directory, mounted,
    after the commits) per copy."""
    backing = ctx.backend.backing
    rel = f"run/ckpt-{ck['step']:06d}.pt"
    ctx.torch_save(rel, {"model": ck["model"], "optimizer": ck["optimizer"], "scheduler": ck["scheduler"]})
    ctx.commit(ck["step"])
    os.sync()
    size = os.path.getsize(ctx.p(rel))
    before = du(backing, "-B1")
    out = {"file_bytes": size, "store_after_original": before}
    for label, dst in (("same_folder", "run/ckpt-copy.pt"), ("other_folder", "other/ckpt-copy.pt")):
        ctx.copy2(rel, dst)
        ctx.commit(ck["step"])
        os.sync()
        after = du(backing, "-B1")
        out[label] = {"path": dst, "store_growth_bytes": after - before, "growth_pct": 100.0 * (after - before) / size,
                      "base": ctx.versions[-1]["base"] or None, "codec": ctx.versions[-1]["codec"],
                      "stored_bytes": ctx.versions[-1]["stored_bytes"]}
        before = after
    return out


# --------------------------------------------------------------------------
# Results


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="full", choices=sorted(SIZES))
    ap.add_argument("--layouts", default=",".join(LAYOUTS))
    ap.add_argument("--workdir", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "ckptfs-eval-layouts"))
    ap.add_argument("--results", default="results")
    ap.add_argument("--mount-opts", default="", help="extra -o options, comma-separated (K=V,...)")
    ap.add_argument("--lossy", default="on", choices=["on", "off"])
    ap.add_argument("--keep-stores", action="store_true",
                    help="keep each layout's backing directory under WORKDIR/SIZE/LAYOUT (default: removed when it verified)")
    args = ap.parse_args()
    layouts = [s for s in args.layouts.split(",") if s]
    unknown = [s for s in layouts if s not in LAYOUTS]
    if unknown:
        ap.error(f"unknown layouts {unknown}; want some of {','.join(LAYOUTS)}")
    why = bk.fuse_problem()
    if why:
        raise SystemExit(f"exp_layouts: cannot mount: {why}")
    # One intra-op thread unless CKPTFS_EVAL_THREADS says otherwise (common.set_threads:
    # on a busy 2-core machine two threads ran this MLP's steps 20x slower).
    common.set_threads()
    options = [f"lossy={args.lossy}"] + [o for o in args.mount_opts.split(",") if o]
    budgets = Budgets(options)
    workdir = os.path.abspath(os.path.join(args.workdir, args.size))
    os.makedirs(workdir, exist_ok=True)

    h.log(f"[layouts] training the {args.size} run")
    run, ckpts = train_run(args.size)
    h.log(f"[layouts] {run['checkpoints']} checkpoints, {run['parameters']} parameters, "
          f"{run['train_seconds']} s")
    res = {"experiment": "layouts", "size": args.size, "lossy": args.lossy, "mount_options": options,
           "date": datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M UTC"), "cpus": os.cpu_count(),
           "run": run, "budgets": vars(budgets), "layouts": {}}
    failed = False
    for name in layouts:
        h.log(f"[layouts] {name}")
        try:
            r = run_layout(name, ckpts, run, workdir, options, budgets, lossless=args.lossy == "off")
        except (RuntimeError, OSError, ValueError, KeyError, subprocess.SubprocessError) as e:
            h.log(f"[layouts] {name}: FAILED: {e!r}")
            res["layouts"][name] = {"status": "failed", "reason": repr(e)[-2000:]}
            failed = True
            continue
        res["layouts"][name] = r
        failed |= r["status"] != "ok"
        h.log(f"[layouts] {name}: ratio {r['ratio']:.2f}x, {r['versions']['delta']}/{r['versions']['versions']} "
              f"delta, fsck {'clean' if r['fsck']['clean'] else 'PROBLEMS'}, reads "
              f"{'ok' if r['read']['ok'] else 'FAILED: ' + '; '.join(r['read']['problems'][:3])}")
        if not args.keep_stores and r["status"] == "ok":
            shutil.rmtree(os.path.join(workdir, name), ignore_errors=True)
    summarize(res)
    write_outputs(res, args.results, Check.SLACK)
    h.log(f"[layouts] wrote {args.results}/layouts.{{json,md}}")
    print(json.dumps(res, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
