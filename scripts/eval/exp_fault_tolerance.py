#!/usr/bin/python3
"""Experiment: restore-and-resume fault tolerance (as in DynaQuant).

  exp_fault_tolerance.py --workload digits|charlm|transfer|resnet|finetune-bf16 [--size full|smoke]
      [--backends ckptfs-lossless,ckptfs-lossy:1e-2,...] [--seeds 0[,1,2,...]]
      [--workdir DIR] [--results DIR]

The baseline is an uninterrupted run of seed 0 on a plain directory, plus
seeds 1 and 2 to measure the seed-to-seed spread. For each backend the same
seed-0 run is interrupted every restore_every steps (10 restores in the full
size); each segment is a new process that resumes with torch.load from the
checkpoint read back from the mount after an unmount + remount. With
--seeds 0,1,2 each backend also runs seeds 1 and 2 that way, each compared
with the uninterrupted run of its own seed, in a store of its own: a lossy
restore perturbs the trajectory much as another seed does, so one seed's
difference alone says little (any seeds of 0-99 may be asked for; the
seed spread is over seeds 0-2 and those). The data
order is a function of the step, so a lossless backend must end bit-identical
to the baseline: the experiment checks it and exits 1 when it does not.
For the fine-tunes (`transfer`, `finetune-bf16`), fine-tuning also starts
from the pretrained checkpoint read back from the mount (the baseline starts
from the original file).

Writes RESULTS/fault-<workload>.json, .md and .png.
"""
import argparse
import datetime
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import backends as bk  # noqa: E402
import harness as h  # noqa: E402

ACC_TOLERANCE = 0.005   # 0.5 accuracy points
LOSS_TOLERANCE = 0.01   # 1 % of the final loss


def final_eval(path):
    import torch
    return torch.load(path)["eval"]


def curves(logpath):
    train, evals, seconds = h.read_log(logpath)
    steps = sorted(train)
    return {"train_steps": steps, "train_loss": [train[s] for s in steps],
            "eval_steps": sorted(evals), "eval": [evals[s] for s in sorted(evals)], "seconds": seconds}


def within_target(metric, got, ref):
    if metric == "accuracy":
        return abs(got["accuracy"] - ref["accuracy"]) <= ACC_TOLERANCE
    return abs(got["loss"] - ref["loss"]) <= LOSS_TOLERANCE * ref["loss"]


def store_ratio(stats):
    out = {}
    for kind, suffix in (("checkpoint", ".pt"), ("safetensors", ".safetensors")):
        files = [s for p, s in sorted(stats.items()) if p.startswith("ckpts/") and p.endswith(suffix)]
        if files:
            lo = sum(s["logical_bytes"] for s in files)
            st = sum(s["stored_bytes"] for s in files)
            out[kind] = {"files": len(files), "logical_bytes": lo, "stored_bytes": st, "ratio": lo / st,
                         "chain_depths": [s.get("chain_depth") for s in files]}
    return out


def run(args, extra=None):
    seeds = [int(x) for x in args.seeds.split(",") if x.strip().isdigit()]
    if not seeds or any(x > 99 for x in seeds) or len(set(seeds)) != len(seeds) or \
            len(seeds) != len(args.seeds.split(",")):
        raise SystemExit(f"--seeds {args.seeds}: want distinct seeds of 0-99, comma-separated")
    # The uninterrupted runs: seeds 0-2 for the spread, and every seed asked for.
    baseline_seeds = sorted(set(h.SEEDS) | set(seeds))
    sched = h.schedule(args.workload, args.size)
    metric = sched["metric"]
    expdir = os.path.join(args.workdir, f"{args.workload}-{args.size}", "fault")
    shutil.rmtree(expdir, ignore_errors=True)
    res = {"experiment": "fault-tolerance", "workload": args.workload, "size": args.size,
           "date": datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M UTC"), "cpus": os.cpu_count(),
           "schedule": sched, "metric": metric, "baseline": {}, "backends": {}}
    baseline_state = {}  # seed -> the uninterrupted run's final checkpoint, for the bit-identity check
    for seed in baseline_seeds:
        h.log(f"[fault {args.workload}] baseline seed {seed}")
        b = h.baseline_run(args.workdir, args.workload, args.size, seed)
        baseline_state[seed] = b["final"]
        res["baseline"][f"seed{seed}"] = {"final": final_eval(b["final"]), "curves": curves(b["log"])}
    vals = [res["baseline"][f"seed{s}"]["final"][metric] for s in baseline_seeds]
    res["seed_spread"] = {"metric": metric, "min": min(vals), "max": max(vals), "range": max(vals) - min(vals),
                          "seeds": baseline_seeds}
    init_source = h.pretrained_checkpoint(args.workdir, args.workload, args.size)

    failures = []
    for spec, b, work in bk.runnable(args.backends, expdir, res, h.log, f"fault {args.workload}"):
        per_seed = {}
        try:
            for seed in seeds:
                h.log(f"[fault {args.workload}] {spec}: training with restores, seed {seed}")
                rundir = work if seed == seeds[0] else f"{work}-seed{seed}"
                r = h.resumed_run(b, rundir, args.workload, args.size, seed, init_source=init_source)
                ref_k = res["baseline"][f"seed{seed}"]["final"]
                got = final_eval(r["final"])
                identical, max_diff = h.compare_states(baseline_state[seed], r["final"])
                per_seed[f"seed{seed}"] = {
                    "seed": seed, "restores": r["restores"], "final": got,
                    "delta": {k: got[k] - ref_k[k] for k in ("loss", "accuracy")},
                    "within_target": within_target(metric, got, ref_k),
                    "bit_identical": identical, "max_abs_diff": max_diff,
                    "store": store_ratio(r["stats"]), "curves": curves(r["log"])}
                if not getattr(b, "lossy", False) and not identical:
                    failures.append(f"{spec}: lossless resume of seed {seed} is not bit-identical "
                                    f"(max |diff| {max_diff})")
                if seed != seeds[0]:
                    shutil.rmtree(rundir, ignore_errors=True)
        except (RuntimeError, OSError, subprocess.SubprocessError) as e:
            # A backend that breaks training is a result, not a reason to lose the others.
            h.log(f"[fault {args.workload}] {spec}: FAILED: {e}")
            res["backends"][spec] = {"status": "failed", "reason": str(e)[-2000:]}
            failures.append(f"{spec}: {str(e).splitlines()[0]}")
            continue
        # The first seed's run is the backend's entry (seed 0 by default); the
        # others, when asked for, are listed under "per_seed".
        entry = {"status": "ok", "mount_options": getattr(b, "options", []), "note": getattr(b, "note", None),
                 **per_seed[f"seed{seeds[0]}"]}
        if len(seeds) > 1:
            key = "accuracy" if metric == "accuracy" else "loss"
            rel = [p["delta"][key] / (1.0 if metric == "accuracy" else res["baseline"][s]["final"]["loss"])
                   for s, p in per_seed.items()]
            entry["per_seed"] = {s: {k: v for k, v in p.items() if k != "curves"} for s, p in per_seed.items()}
            entry["per_seed_summary"] = {"metric": key, "relative": metric != "accuracy", "deltas": rel,
                                         "mean": sum(rel) / len(rel), "min": min(rel), "max": max(rel),
                                         "all_within_target": all(p["within_target"] for p in per_seed.values())}
        if extra:
            entry.update(extra(b, work))
        res["backends"][spec] = entry
        shutil.rmtree(work, ignore_errors=True)
    res["failures"] = failures
    write_outputs(res, args.results)
    for f in failures:
        h.log(f"[fault {args.workload}] FAILED: {f}")
    return res


def write_outputs(res, results):
    name = res["workload"]
    base = os.path.join(results, f"fault-{name}")
    h.write_json(base + ".json", res)
    metric = res["metric"]
    ref = res["baseline"]["seed0"]["final"]
    headers = ["run", "restores", "final accuracy", "final loss", "Δ vs uninterrupted (same seed)",
               "within target", "bit-identical", "store ratio (.pt)"]
    rows = []
    for seed, b in res["baseline"].items():
        f = b["final"]
        rows.append([f"plain, uninterrupted, {seed}", 0, f"{100 * f['accuracy']:.2f}%", f"{f['loss']:.4f}",
                     "-", "-", "-", "1.00x"])
    for spec, b in res["backends"].items():
        if b["status"] != "ok":
            rows.append([spec] + [b["status"]] * (len(headers) - 1))
            continue
        for p in b.get("per_seed", {"first": b}).values():
            f, d = p["final"], p["delta"]
            seed_ref = res["baseline"][f"seed{p.get('seed', 0)}"]["final"]
            delta = (f"{100 * d['accuracy']:+.2f} pts" if metric == "accuracy"
                     else f"{100 * d['loss'] / seed_ref['loss']:+.3f}% loss")
            st = p["store"].get("checkpoint", {})
            rows.append([f"{spec}, seed{p.get('seed', 0)}", p["restores"], f"{100 * f['accuracy']:.2f}%",
                         f"{f['loss']:.4f}", delta, "yes" if p["within_target"] else "**no**",
                         "yes" if p["bit_identical"] else f"no (max |Δ| {p['max_abs_diff']:.2g})",
                         f"{st.get('ratio', 0):.2f}x"])
    sp = res["seed_spread"]
    spread = (f"{100 * sp['range']:.2f} accuracy points" if metric == "accuracy"
              else f"{sp['range']:.4f} loss ({100 * sp['range'] / ref['loss']:.2f}%)")
    target = "accuracy within 0.5 points" if metric == "accuracy" else "final loss within 1%"
    md = [f"### Fault tolerance: {name} ({res['size']}; target: {target} of the uninterrupted run after "
          f"{res['schedule']['steps'] // res['schedule']['restore_every'] - 1} restores)\n",
          h.markdown_table(headers, rows),
          f"\nSeed-to-seed spread of the baseline (seeds "
          f"{','.join(str(x) for x in sp.get('seeds', h.SEEDS))}): {spread}.\n"]
    for spec, b in res["backends"].items():
        if b.get("per_seed_summary"):
            m = b["per_seed_summary"]
            fmt = (lambda x: f"{100 * x:+.2f} pts") if metric == "accuracy" else (lambda x: f"{100 * x:+.3f}%")
            md.append(f"- `{spec}`: over seeds {', '.join(s[4:] for s in b['per_seed'])}, Δ vs the uninterrupted "
                      f"run of the same seed: mean {fmt(m['mean'])}, from {fmt(m['min'])} to {fmt(m['max'])}; "
                      f"within target for {sum(p['within_target'] for p in b['per_seed'].values())} of "
                      f"{len(b['per_seed'])} seeds\n")
        if b["status"] != "ok":
            md.append(f"- `{spec}`: {b['status']} — {b['reason'].splitlines()[0]}\n")
        elif b.get("note"):
            md.append(f"- `{spec}`: {b['note']}\n")
        if b.get("pretrained"):
            p = b["pretrained"]
            md.append(f"- `{spec}`: pretrained checkpoint read back from the mount: bit-identical "
                      f"{'yes' if p['bit_identical'] else 'no'}, max |Δ| {p['max_abs_diff']:.3g}, "
                      f"store ratio {p['ratio']:.2f}x\n")
    for f in res.get("failures", []):
        md.append(f"- **FAILED**: {f}\n")
    with open(base + ".md", "w") as f:
        f.write("\n".join(md[:3]) + "\n" + "".join(md[3:]))

    plt = h.pyplot()
    series = [(f"plain {s}", b["curves"], ":" if s != "seed0" else "-") for s, b in res["baseline"].items()]
    series += [(h.short_backend(spec), b["curves"], "--") for spec, b in res["backends"].items()
               if b["status"] == "ok"]
    # One legend under the panels: the backends' names are long.
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2 + 0.2 * len(series) / 2))

    def smooth(v, k=10):
        out, acc = [], 0.0
        for i, x in enumerate(v):
            acc += x - (v[i - k] if i >= k else 0)
            out.append(acc / min(i + 1, k))
        return out
    for label, c, style in series:
        axes[0].plot(c["train_steps"], smooth(c["train_loss"]), style, label=label, linewidth=1)
        axes[1].plot(c["eval_steps"], [e[metric] for e in c["eval"]], style, marker=".", linewidth=1)
    for s in range(res["schedule"]["restore_every"], res["schedule"]["steps"], res["schedule"]["restore_every"]):
        axes[0].axvline(s, color="grey", alpha=0.15)
    axes[0].set_yscale("log")  # a diverging run would flatten every other curve
    axes[0].set_title(f"{name}: training loss (moving average of 10); grey = restores", fontsize=10)
    axes[1].set_title(f"{name}: held-out {metric}")
    for ax in axes:
        ax.set_xlabel("training step")
        ax.grid(True, alpha=0.3)
    legend_rows = (len(series) + 1) // 2
    fig.legend(loc="lower center", ncol=2, fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, min(0.6, 0.16 * legend_rows / fig.get_figheight()), 1, 1))
    fig.savefig(base + ".png", dpi=110)
    plt.close(fig)


def parser(doc):
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="full", choices=["full", "smoke"])
    ap.add_argument("--backends", default="ckptfs-lossless,ckptfs-lossy:1e-2,ckptfs-lossy:1e-2:1e-2,ckptfs-lossy:5e-2,ckptfs-lossy:1e-1")
    ap.add_argument("--seeds", default="0", help="comma-separated seeds each backend runs (0-99)")
    ap.add_argument("--workdir", default="/tmp/ckptfs-eval")
    ap.add_argument("--results", default="results")
    return ap


def main():
    ap = parser(__doc__)
    ap.add_argument("--workload", required=True, choices=h.WORKLOADS)
    res = run(ap.parse_args())
    return 1 if res["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
