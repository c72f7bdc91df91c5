#!/usr/bin/python3
"""Combines the experiments' JSON results into the headline table: per
workload and backend, the cumulative compression ratio (weights + optimizer
state) and the final metric after the restores, against the targets
(>= 40x with accuracy within 0.5 points, or final loss within 1%). Where
the fault-tolerance run has several seeds per backend (--seeds), accuracy is
judged on the mean difference over them.

  summary.py --results DIR   (prints markdown; run-all.sh writes DIR/summary.md)
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import exp_fault_tolerance as ft  # noqa: E402
import harness as h  # noqa: E402

TARGET_RATIO = 40.0


def load(path):
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", required=True)
    args = ap.parse_args()
    headers = ["workload", "backend", "ratio w+opt (cumulative)", "ratio .pt files (cumulative)",
               "after restores: Δ vs uninterrupted", "seed spread", "bit-identical", "target met"]
    rows = []
    for w in ("digits", "charlm", "transfer", "resnet", "finetune-bf16"):
        comp = load(os.path.join(args.results, f"compression-{w}.json"))
        fault = load(os.path.join(args.results, f"fault-{w}.json"))
        if not comp and not fault:
            continue
        if comp:
            z = next((v for k, v in comp["backends"].items() if k.startswith("zstd")), None)
            if z and z["status"] == "ok":
                rows.append([w, "zstd -3 (reference, no restores)", f"{z['summary']['weights+optimizer']['ratio']:.2f}x",
                             f"{z['summary']['checkpoint']['ratio']:.2f}x", "-", "-", "-", "-"])
        specs = []
        for src in (comp, fault):
            for s in (src or {}).get("backends", {}):
                if s.startswith("ckptfs") and s not in specs:
                    specs.append(s)
        for spec in specs:
            c = (comp or {}).get("backends", {}).get(spec, {"status": "not run"})
            f = (fault or {}).get("backends", {}).get(spec, {"status": "not run"})
            ratio = c["summary"]["weights+optimizer"]["ratio"] if c["status"] == "ok" else None
            ratio_pt = c["summary"]["checkpoint"]["ratio"] if c["status"] == "ok" else None
            if f["status"] == "ok":
                metric = fault["metric"]
                ref = fault["baseline"]["seed0"]["final"]
                delta = (f"{100 * f['delta']['accuracy']:+.2f} pts" if metric == "accuracy"
                         else f"{100 * f['delta']['loss'] / ref['loss']:+.3f}% loss")
                if f.get("per_seed_summary"):  # --seeds: the mean over the seeds, and how many met the target
                    m = f["per_seed_summary"]
                    mean = f"{100 * m['mean']:+.2f} pts" if metric == "accuracy" else f"{100 * m['mean']:+.3f}%"
                    hits = sum(p["within_target"] for p in f["per_seed"].values())
                    delta += f" (mean of {len(f['per_seed'])} seeds {mean}, {hits} within target)"
                sp = fault["seed_spread"]
                spread = (f"{100 * sp['range']:.2f} pts" if metric == "accuracy"
                          else f"{100 * sp['range'] / ref['loss']:.2f}% loss")
                ident = "yes" if f["bit_identical"] else "no"
            else:
                delta = spread = ident = f["status"]
            if ratio is None or f["status"] != "ok":
                met = "failed" if "failed" in (c["status"], f["status"]) else "not run"
            else:
                ok_r, ok_a = ratio >= TARGET_RATIO, f["within_target"]
                if f.get("per_seed_summary"):
                    # Several seeds: the target is judged on their mean difference
                    # (one seed's difference is about as noisy as the target).
                    m = f["per_seed_summary"]
                    ok_a = abs(m["mean"]) <= (ft.ACC_TOLERANCE if fault["metric"] == "accuracy" else ft.LOSS_TOLERANCE)
                met = "yes" if ok_r and ok_a else "no (" + ", ".join(
                    x for x, bad in (("ratio", not ok_r), ("accuracy", not ok_a)) if bad) + ")"
            rows.append([w, spec, f"{ratio:.2f}x" if ratio else c["status"], f"{ratio_pt:.2f}x" if ratio_pt else
                         c["status"], delta, spread, ident, met])
    print(h.markdown_table(headers, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
