"""Shared harness of the eval experiments: workload schedules, running the
trainer as a subprocess (one process per restore-and-resume cycle), reading
its logs, comparing final states and writing JSON / markdown / PNG results."""
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON = os.environ.get("CKPTFS_EVAL_PYTHON", "/usr/bin/python3")

# Per experiment workload and size: trainer workload, total steps, checkpoint
# interval, restore interval (steps = (restores + 1) * restore_every, so a run
# is interrupted `restores` times at fixed steps), and the metric the targets
# use. A schedule with "pretrain" fine-tunes from the checkpoint that
# trainer makes in that many steps (seed 0, plain directory): "transfer"
# from digits-pretrain, "finetune-bf16" from charlm-pretrain. "resnet" and
# "finetune-bf16" are the workloads nothing was tuned on (docs/eval.md).
SCHEDULES = {
    ("digits", "full"): dict(trainer="digits", steps=440, save_every=20, restore_every=40, metric="accuracy"),
    ("digits", "smoke"): dict(trainer="digits", steps=30, save_every=5, restore_every=10, metric="accuracy"),
    ("charlm", "full"): dict(trainer="charlm", steps=110, save_every=5, restore_every=10, metric="loss"),
    ("charlm", "smoke"): dict(trainer="charlm", steps=15, save_every=5, restore_every=5, metric="loss"),
    ("transfer", "full"): dict(trainer="digits-finetune", steps=220, save_every=10, restore_every=20,
                               metric="accuracy", pretrain=("digits-pretrain", 300)),
    ("transfer", "smoke"): dict(trainer="digits-finetune", steps=30, save_every=5, restore_every=10,
                                metric="accuracy", pretrain=("digits-pretrain", 20)),
    ("resnet", "full"): dict(trainer="resnet", steps=440, save_every=20, restore_every=40, metric="accuracy"),
    ("resnet", "smoke"): dict(trainer="resnet", steps=30, save_every=5, restore_every=10, metric="accuracy"),
    ("finetune-bf16", "full"): dict(trainer="charlm-finetune-bf16", steps=110, save_every=5, restore_every=10,
                                    metric="loss", pretrain=("charlm-pretrain", 200)),
    ("finetune-bf16", "smoke"): dict(trainer="charlm-finetune-bf16", steps=15, save_every=5, restore_every=5,
                                     metric="loss", pretrain=("charlm-pretrain", 10)),
}
WORKLOADS = sorted({w for w, _ in SCHEDULES})
SEEDS = (0, 1, 2)


def schedule(workload, size):
    try:
        return SCHEDULES[(workload, size)]
    except KeyError:
        raise SystemExit(f"unknown workload/size {workload}/{size}; want one of {sorted(SCHEDULES)}")


def run_trainer(trainer, out, steps, save_every, size, seed, log, stop_at=None, resume=None, init=None,
                final=None, extra=()):
    cmd = [PYTHON, os.path.join(HERE, "train.py"), trainer, "--out", out, "--steps", str(steps),
           "--save-every", str(save_every), "--size", size, "--seed", str(seed), "--log", log]
    if stop_at:
        cmd += ["--stop-at", str(stop_at)]
    if resume:
        cmd += ["--resume", resume]
    if init:
        cmd += ["--init", init]
    if final:
        cmd += ["--final", final]
    cmd += list(extra)
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"trainer failed ({r.returncode}): {' '.join(cmd)}\n{r.stderr[-3000:]}")


def read_log(path):
    """(train_loss by step, eval metrics by step, seconds of training)."""
    train, evals, seconds = {}, {}, 0.0
    with open(path) as f:
        for line in f:
            rec = json.loads(line)
            if "train_loss" in rec:
                train[rec["step"]] = rec["train_loss"]
            elif "eval" in rec:
                evals[rec["step"]] = rec["eval"]
            elif "done" in rec:
                seconds += rec["seconds"]
    return train, evals, seconds


def pretrained_checkpoint(workdir, workload, size):
    """The original pretrained checkpoint a fine-tuning workload starts from
    (its schedule's "pretrain": trainer and steps; seed 0, plain directory);
    trained once and cached in workdir. None for other workloads."""
    sched = schedule(workload, size)
    if "pretrain" not in sched:
        return None
    d = os.path.join(workdir, f"{workload}-{size}", "pretrain")
    path = os.path.join(d, "pretrained.pt")
    if not os.path.exists(path):
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        trainer, n = sched["pretrain"]
        run_trainer(trainer, os.path.join(d, "ckpts"), n, n, size, 0, os.path.join(d, "train.log"))
        shutil.copyfile(os.path.join(d, "ckpts", f"ckpt_{n:06d}.pt"), path)
    return path


def baseline_run(workdir, workload, size, seed):
    """An uninterrupted run on a plain directory, cached in workdir. Returns
    {dir, ckpts (dir), final (path), log (path)}."""
    sched = schedule(workload, size)
    d = os.path.join(workdir, f"{workload}-{size}", f"baseline-seed{seed}")
    res = {"dir": d, "ckpts": os.path.join(d, "ckpts"), "final": os.path.join(d, "final.pt"),
           "log": os.path.join(d, "train.log")}
    if os.path.exists(res["final"]):
        return res
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    init = pretrained_checkpoint(workdir, workload, size)
    run_trainer(sched["trainer"], res["ckpts"], sched["steps"], sched["save_every"], size, seed, res["log"],
                init=init, final=res["final"])
    return res


def resumed_run(backend, rundir, workload, size, seed, init_source=None):
    """Trains `workload` with its checkpoints in `backend`, interrupted at
    every restore_every steps: each segment is a new process that resumes
    with torch.load from the checkpoint read back from the backend, after an
    unmount + remount (so the bytes come from the store, not from staging or
    the page cache). `init_source` (transfer): the pretrained checkpoint,
    copied into the backend first and read back from it (after a remount)
    by every segment. Returns {final, log, restores, stats}."""
    sched = schedule(workload, size)
    os.makedirs(rundir, exist_ok=True)
    log, final = os.path.join(rundir, "train.log"), os.path.join(rundir, "final.pt")
    if os.path.exists(log):
        os.remove(log)
    root = backend.start(rundir)
    try:
        ckdir = os.path.join(root, "ckpts")
        init_path = None
        if init_source:
            init_path = os.path.join(root, "pretrained.pt")
            shutil.copyfile(init_source, init_path)
            backend.cycle()
        restores, resume = 0, None
        stops = list(range(sched["restore_every"], sched["steps"], sched["restore_every"])) + [sched["steps"]]
        for stop in stops:
            last = stop == sched["steps"]
            run_trainer(sched["trainer"], ckdir, sched["steps"], sched["save_every"], size, seed, log,
                        stop_at=stop, resume=resume, init=init_path, final=final if last else None)
            if not last:
                backend.cycle()
                resume = os.path.join(ckdir, f"ckpt_{stop:06d}.pt")
                restores += 1
        backend.wait_idle()
        backend.stop()
        stats = backend.stats()
    except BaseException:
        if hasattr(backend, "teardown"):
            backend.teardown()
        raise
    return {"final": final, "log": log, "restores": restores, "stats": stats}


def compare_states(path_a, path_b):
    """(bit_identical, max_abs_diff over model + optimizer tensors)."""
    import torch
    a, b = torch.load(path_a), torch.load(path_b)
    same, worst = True, 0.0

    def walk(x, y):
        nonlocal same, worst
        if isinstance(x, torch.Tensor):
            if x.dtype != y.dtype or x.shape != y.shape:
                same, worst = False, float("inf")
                return
            if x.is_floating_point():
                bits = {torch.float32: torch.int32, torch.float64: torch.int64,
                        torch.float16: torch.int16, torch.bfloat16: torch.int16}[x.dtype]
                if not torch.equal(x.view(bits), y.view(bits)):
                    same = False
                    d = (x.double() - y.double()).abs().max().item()
                    worst = d if d != d or worst != worst else max(worst, d)  # NaN sticks
            elif not torch.equal(x, y):
                same, worst = False, float("inf")
        elif isinstance(x, dict):
            if x.keys() != y.keys():
                same, worst = False, float("inf")
                return
            for k in x:
                walk(x[k], y[k])
        elif isinstance(x, (list, tuple)):
            if len(x) != len(y):
                same, worst = False, float("inf")
                return
            for u, v in zip(x, y):
                walk(u, v)
        elif x != y:
            same = False
    walk({"model": a["model"], "optimizer": a["optimizer"]}, {"model": b["model"], "optimizer": b["optimizer"]})
    return same, worst


def markdown_table(headers, rows):
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(str(c) for c in r) + " |")
    return "\n".join(lines) + "\n"


def write_json(path, obj):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")


def pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def short_backend(spec):
    """A backend's name for a plot legend: `ckptfs-lossy:` and `ckptfs-` dropped."""
    for prefix in ("ckptfs-lossy:", "ckptfs-"):
        if spec.startswith(prefix):
            return "lossy " + spec[len(prefix):] if prefix == "ckptfs-lossy:" else spec[len(prefix):]
    return spec


def log(msg):
    print(msg, file=sys.stderr, flush=True)
