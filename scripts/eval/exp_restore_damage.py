#!/usr/bin/python3
"""Experiment: what a lossy restore does to the model, before training
chaos hides it.

  exp_restore_damage.py --workload digits|charlm|transfer|resnet|finetune-bf16 [--size full|smoke]
      [--backends ckptfs-lossless,ckptfs-lossy:1e-2,...] [--oracle-gains] [--noise 1e-6,...] [--horizon N]
      [--workdir DIR] [--results DIR]

The fault-tolerance experiment compares where restored runs end up after
10 restores; on some workloads any changed bit sends training down another
path, and the final accuracy moves by more than the target whatever the
codec (docs/eval.md, "SGD's momentum on its step"). This one measures each
restore alone. The seed-0 run's checkpoints (an uninterrupted run on a plain
directory, as in exp_compression.py) are replayed into each backend in
order, the mount is cycled, and each checkpoint is read back from it:

- right after the restore: the read-back model's eval metric against the
  original checkpoint's at the same step (the weights' error alone);
- after `--horizon` more steps (default: the schedule's restore interval):
  training resumed from the read-back checkpoint (weights, optimizer state,
  scheduler, RNG) against the uninterrupted run at the same step. The data
  order is a function of the step, so a lossless restore gives exactly the
  uninterrupted run's numbers; what differs is the restore's doing, over
  a span short enough that the trajectories have not drifted apart.

`--oracle-gains` adds, for each lossy backend, its read-back checkpoints
with Adam's moments scaled per tensor to remove their bias against the
originals (exp_avg by <m, m> / <m_restored, m>, exp_avg_sq by
exp(-mean log(v_restored / v))): an oracle, what an encoder that
reconstructs the state without those biases would reach at the same bytes.

`--noise R,...` adds controls without any store: the original checkpoints
with white noise of relative size R on the model's floating tensors. At a
tiny R (1e-6) the horizon's differences are how far training drifts from
any changed bit; at R = a codec budget, what unstructured error of that
size does.

Differences are accuracy points (accuracy workloads) or % of the loss (loss
workloads), against the fault-tolerance targets (0.5 points, 1 %), and for
every workload in % of the eval loss, which moves continuously where the
accuracy moves by whole eval samples. A lossless store must differ by
nothing (exit 1 otherwise). Writes RESULTS/damage-<workload>.json and .md.
"""
import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import backends as bk  # noqa: E402
import harness as h  # noqa: E402
import state_bias  # noqa: E402
from exp_compression import sequence  # noqa: E402

TARGET = {"accuracy": 0.5, "loss": 1.0}  # points, % of the loss
UNIT = {"accuracy": "pts", "loss": "% loss"}


def checkpoints(ckdir):
    """[(step, filename)] of the run's torch.save checkpoints, in order."""
    return [(step, files["checkpoint"]) for step, files in sequence(ckdir)]


def difference(metric, got, ref):
    """Signed difference in the target's unit (points, or % of the loss)."""
    if metric == "accuracy":
        return 100.0 * (got["accuracy"] - ref["accuracy"])
    return 100.0 * (got["loss"] - ref["loss"]) / ref["loss"]


def last_eval(log):
    _, evals, _ = h.read_log(log)
    if not evals:
        raise RuntimeError(f"no evaluation in {log}")
    step = max(evals)
    return step, evals[step]


def evaluate_restores(restored, work, base, seq, workload, size, horizon, init):
    """Per checkpoint: the metrics of restored[step] (a checkpoint file)
    right away and after `horizon` resumed steps, next to the original's."""
    sched = h.schedule(workload, size)
    _, ref_evals, _ = h.read_log(base["log"])
    rows = []
    for step, _ in seq:
        row = {"step": step}
        with tempfile.TemporaryDirectory(dir=work) as tmp:
            log = os.path.join(tmp, "eval.log")
            h.run_trainer(sched["trainer"], os.path.join(tmp, "out"), sched["steps"], sched["save_every"], size,
                          0, log, resume=restored[step], init=init, extra=["--eval-only"])
            _, row["restored"] = last_eval(log)
            row["original"] = ref_evals[step]
            if step + horizon <= sched["steps"]:
                log = os.path.join(tmp, "resume.log")
                h.run_trainer(sched["trainer"], os.path.join(tmp, "out"), sched["steps"], sched["save_every"],
                              size, 0, log, stop_at=step + horizon, resume=restored[step], init=init)
                at, row["resumed"] = last_eval(log)
                if at != step + horizon:
                    raise RuntimeError(f"resumed run evaluated at step {at}, not {step + horizon}")
                row["uninterrupted"] = ref_evals[step + horizon]
        rows.append(row)
    return rows


def with_oracle_gains(original, restored):
    """`restored` with each of Adam's moments scaled, per tensor, to remove
    its bias against `original` (state_bias.moment_bias): exp_avg by
    <m, m> / <m_restored, m> (a quantizer that minimizes the squared error
    shrinks it), exp_avg_sq by exp(-mean log(v_restored / v)). An oracle (it
    reads the original): what a reconstruction without those biases would
    do, at the same bytes."""
    import math
    for key, st in original["optimizer"]["state"].items():
        if "exp_avg" not in st or "exp_avg_sq" not in st:
            continue
        rs = restored["optimizer"]["state"][key]
        b = state_bias.moment_bias(st, rs)
        if b["m_dot"] > 0:
            rs["exp_avg"] = (rs["exp_avg"].double() * (b["m_energy"] / b["m_dot"])).to(rs["exp_avg"].dtype)
        if b["v_count"] > 0:
            scale = math.exp(-b["v_log_sum"] / b["v_count"])
            rs["exp_avg_sq"] = (rs["exp_avg_sq"].double() * scale).to(rs["exp_avg_sq"].dtype)
    return restored


def measure(backend, work, base, seq, workload, size, horizon, init, oracle=False):
    """The checkpoints read back from `backend`: evaluate_restores' rows and
    the backend's cumulative ratio; with `oracle`, also the rows of the same
    checkpoints with_oracle_gains (else None)."""
    root = backend.start(work)
    oracle_rows = None
    try:
        for _, name in seq:
            shutil.copyfile(os.path.join(base["ckpts"], name), os.path.join(root, name))
            backend.wait_idle()
        backend.cycle()  # read back from the store, not from staging or the page cache
        restored = {step: os.path.join(root, name) for step, name in seq}
        rows = evaluate_restores(restored, work, base, seq, workload, size, horizon, init)
        if oracle:
            import torch
            fixed = {}
            for step, name in seq:
                fixed[step] = os.path.join(work, "oracle-" + name)
                torch.save(with_oracle_gains(torch.load(os.path.join(base["ckpts"], name)),
                                             torch.load(restored[step])), fixed[step])
            oracle_rows = evaluate_restores(fixed, work, base, seq, workload, size, horizon, init)
        backend.stop()
    except BaseException:
        backend.teardown()
        raise
    stats = backend.stats()
    logical = sum(stats[n]["logical_bytes"] for _, n in seq)
    stored = sum(stats[n]["stored_bytes"] for _, n in seq)
    return rows, logical / max(stored, 1), oracle_rows


def measure_noise(rel, work, base, seq, workload, size, horizon, init):
    """A control without any store: every floating tensor of the model
    (weights and buffers; the optimizer state untouched) plus white noise of
    `rel` times its RMS (a rel_l2 error of `rel`), seeded by the step. At a
    tiny `rel` this is how far training drifts from any changed bit."""
    import torch
    os.makedirs(work, exist_ok=True)
    restored = {}
    for step, name in seq:
        ckpt = torch.load(os.path.join(base["ckpts"], name))
        gen = torch.Generator().manual_seed(step)
        for key, t in ckpt["model"].items():
            if t.is_floating_point() and t.numel() > 0:
                rms = t.float().pow(2).mean().sqrt()
                noise = torch.randn(t.shape, generator=gen) * (rel * rms)
                ckpt["model"][key] = (t.float() + noise).to(t.dtype)
        restored[step] = os.path.join(work, name)
        torch.save(ckpt, restored[step])
    return evaluate_restores(restored, work, base, seq, workload, size, horizon, init)


def summarize(rows, metric):
    """Per phase: the differences in the target's metric, and in % of the
    eval loss (continuous, where accuracy moves by whole eval samples)."""
    out = {}
    for what, got, ref in (("right_after", "restored", "original"), ("after_horizon", "resumed", "uninterrupted")):
        d = [difference(metric, r[got], r[ref]) for r in rows if got in r]
        if not d:
            continue
        loss = [difference("loss", r[got], r[ref]) for r in rows if got in r]
        out[what] = {"restores": len(d), "mean": statistics.fmean(d), "mean_abs": statistics.fmean(abs(x) for x in d),
                     "worst": max(d, key=abs), "within_target": sum(abs(x) <= TARGET[metric] for x in d),
                     "loss_pct": {"mean": statistics.fmean(loss), "mean_abs": statistics.fmean(abs(x) for x in loss),
                                  "worst": max(loss, key=abs)}}
    return out


def write_outputs(res, results):
    os.makedirs(results, exist_ok=True)
    path = os.path.join(results, f"damage-{res['workload']}")
    h.write_json(path + ".json", res)
    metric, unit = res["metric"], UNIT[res["metric"]]
    lines = [f"# Restore damage: {res['workload']} ({res['size']})", "",
             f"{res['date']}, {res['cpus']} cpus, {res['checkpoints']} checkpoints, horizon {res['horizon']} steps; "
             f"restored minus original, {metric} in {unit} (target {TARGET[metric]:g}: how many within), "
             "and the eval loss in % (mean of |difference| / worst).", ""]
    horizon = f"after {res['horizon']} steps"
    headers = ["backend", "ratio", f"right after: {metric}", "right after: loss %", f"{horizon}: {metric}",
               f"{horizon}: loss %"]
    rows = []
    for spec, r in res["backends"].items():
        if r["status"] != "ok":
            rows.append([spec, "-", r["status"], r.get("reason", "")[:80], "", ""])
            continue
        cells = [spec, "-" if r["ratio"] is None else f"{r['ratio']:.2f}x"]
        for what in ("right_after", "after_horizon"):
            s = r["summary"].get(what)
            if s is None:
                cells += ["-", "-"]
                continue
            cells.append(f"{s['mean']:+.3f} mean, {s['worst']:+.3f} worst ({s['within_target']} of {s['restores']})")
            cells.append(f"{s['loss_pct']['mean_abs']:.3f} / {s['loss_pct']['worst']:+.3f}")
        rows.append(cells)
    lines.append(h.markdown_table(headers, rows))
    with open(path + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", required=True, choices=h.WORKLOADS)
    ap.add_argument("--size", default="full", choices=["full", "smoke"])
    ap.add_argument("--backends", default="ckptfs-lossless,ckptfs-lossy:1e-2")
    ap.add_argument("--noise", default="",
                    help="controls without a store: relative sizes of white noise added to the model, e.g. 1e-6,1e-2")
    ap.add_argument("--oracle-gains", action="store_true",
                    help="also each lossy backend's checkpoints with Adam's moments unbiased per tensor (an oracle)")
    ap.add_argument("--horizon", type=int, default=None,
                    help="steps resumed after each restore (a multiple of the save interval)")
    ap.add_argument("--workdir", default="/tmp/ckptfs-eval")
    ap.add_argument("--results", default="results")
    args = ap.parse_args()
    sched = h.schedule(args.workload, args.size)
    horizon = args.horizon or sched["restore_every"]
    if horizon <= 0 or horizon % sched["save_every"] != 0:
        raise SystemExit(f"--horizon must be a positive multiple of the save interval ({sched['save_every']})")

    base = h.baseline_run(args.workdir, args.workload, args.size, 0)
    init = h.pretrained_checkpoint(args.workdir, args.workload, args.size)
    seq = checkpoints(base["ckpts"])
    expdir = os.path.join(args.workdir, f"{args.workload}-{args.size}", "damage")
    shutil.rmtree(expdir, ignore_errors=True)
    res = {"experiment": "restore damage", "workload": args.workload, "size": args.size, "metric": sched["metric"],
           "date": datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M UTC"), "cpus": os.cpu_count(),
           "schedule": sched, "horizon": horizon, "checkpoints": len(seq), "backends": {}}
    failed = False
    for spec, b, work in bk.runnable(args.backends, expdir, res, h.log, f"damage {args.workload}"):
        h.log(f"[damage {args.workload}] {spec}: {len(seq)} restores")
        try:
            rows, ratio, oracle_rows = measure(b, work, base, seq, args.workload, args.size, horizon, init,
                                               oracle=args.oracle_gains and b.lossy)
        except (RuntimeError, OSError, KeyError, subprocess.SubprocessError) as e:
            h.log(f"[damage {args.workload}] {spec}: FAILED: {e!r}")
            res["backends"][spec] = {"status": "failed", "reason": repr(e)[-2000:]}
            failed = True
            continue
        summary = summarize(rows, sched["metric"])
        res["backends"][spec] = {"status": "ok", "ratio": ratio, "per_checkpoint": rows, "summary": summary,
                                 "mount_options": b.options}
        h.log(f"[damage {args.workload}] {spec}: {ratio:.2f}x, {json.dumps(summary)}")
        if oracle_rows is not None:
            res["backends"][spec + " (oracle gains)"] = {
                "status": "ok", "ratio": ratio, "per_checkpoint": oracle_rows,
                "summary": summarize(oracle_rows, sched["metric"]), "mount_options": b.options}
        shutil.rmtree(work, ignore_errors=True)
    for rel in [float(x) for x in args.noise.split(",") if x]:
        spec = f"noise:{rel:g}"
        h.log(f"[damage {args.workload}] {spec}: {len(seq)} restores")
        rows = measure_noise(rel, os.path.join(expdir, spec.replace(":", "_")), base, seq, args.workload, args.size,
                             horizon, init)
        res["backends"][spec] = {"status": "ok", "ratio": None, "per_checkpoint": rows,
                                 "summary": summarize(rows, sched["metric"])}
    # A lossless store must restore exactly: nothing may differ.
    lossless = res["backends"].get("ckptfs-lossless", {})
    if lossless.get("status") == "ok":
        for what, s in lossless["summary"].items():
            if s["mean_abs"] != 0.0 or s["loss_pct"]["mean_abs"] != 0.0:
                h.log(f"[damage {args.workload}] ckptfs-lossless differs {what}: {s}")
                failed = True
    write_outputs(res, args.results)
    h.log(f"[damage {args.workload}] wrote {args.results}/damage-{args.workload}.{{json,md}}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
