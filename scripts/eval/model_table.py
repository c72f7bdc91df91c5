#!/usr/bin/python3
"""Markdown table of error_model.py's JSON lines (model-all.sh): per
workload, each variant's final metric, its difference from the uninterrupted
run and the modelled ratios.

  model_table.py error-model.jsonl
"""
import json
import sys


def fmt_ratio(r):
    return "-" if r is None else f"{r:.1f}x"


def main():
    runs = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
    print("| workload | variant (error_model.py options) | final | Δ vs uninterrupted "
          "| ratio w+opt | weights | exp_avg | exp_avg_sq |")
    print("|---|---|---|---|---|---|---|---|")
    for w in sorted({r["workload"] for r in runs}):
        mine = [r for r in runs if r["workload"] == w]
        ref = next((r for r in mine if r["variant"]["uninterrupted"]), None)
        # charlm is judged on the validation loss, digits on the accuracy.
        by_loss = w == "charlm"
        for r in sorted(mine, key=lambda r: (not r["variant"]["uninterrupted"], r["args"])):
            final = r["final"]["loss"] if by_loss else r["final"]["accuracy"]
            shown = f"{final:.4f} loss" if by_loss else f"{100 * final:.2f}%"
            if ref is None or r is ref:
                delta = "-"
            elif by_loss:
                delta = f"{100 * (final / ref['final']['loss'] - 1):+.2f}% loss"
            else:
                delta = f"{100 * (final - ref['final']['accuracy']):+.2f} pts"
            parts = r["ratio_parts"]
            label = r["args"] or "(defaults)"
            print(f"| {w} | `{label}` | {shown} | {delta} | {fmt_ratio(r['ratio'])} | "
                  f"{fmt_ratio(parts['weights'])} | {fmt_ratio(parts['exp_avg'])} | {fmt_ratio(parts['exp_avg_sq'])} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
