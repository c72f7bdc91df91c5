"""The layout experiment's summary (targets) and its outputs: JSON and a
markdown table under the results directory (exp_layouts.py runs it)."""
import os

import harness as h

# The layout each one's ratio is compared with: the one-folder run with the
# same retention.
COMPARED_WITH = {"lightning": "one-folder-keep1", "one-folder-keep3": "one-folder-keep3",
                 "hf-trainer-keep3": "one-folder-keep3", "one-folder-keep1": "one-folder-keep1"}
# Issue #24's targets.
TARGET_VS_ONE_FOLDER = 0.9
TARGET_COPY_GROWTH = 0.01
TARGET_RETENTION = 1.25


def fmt_mb(n):
    return f"{n / 1e6:.2f}"


def summarize(res):
    lay = res["layouts"]
    ref3 = lay.get("one-folder-keep3", {})
    for name, r in lay.items():
        if r.get("status") == "failed" or name == "copy":
            continue
        base = lay.get(COMPARED_WITH.get(name, "one-folder"), {})
        r["compared_with"] = COMPARED_WITH.get(name, "one-folder")
        if base.get("ratio"):
            r["ratio_vs_one_folder"] = r["ratio"] / base["ratio"]
    targets = {}
    for name, r in lay.items():
        if "ratio_vs_one_folder" in r and not name.startswith("one-folder") and name != "copy":
            targets[f"{name}: ratio >= {TARGET_VS_ONE_FOLDER} x {r['compared_with']}"] = \
                r["ratio_vs_one_folder"] >= TARGET_VS_ONE_FOLDER
    if lay.get("hf-trainer-keep3", {}).get("store_bytes") and ref3.get("store_bytes"):
        q = lay["hf-trainer-keep3"]["store_bytes"] / ref3["store_bytes"]
        res["retention"] = {"hf_trainer_keep3_store_bytes": lay["hf-trainer-keep3"]["store_bytes"],
                            "one_folder_keep3_store_bytes": ref3["store_bytes"], "store_quotient": q,
                            "target": TARGET_RETENTION}
        targets[f"retention: hf-trainer-keep3 store <= {TARGET_RETENTION} x one-folder-keep3"] = q <= TARGET_RETENTION
    if "copy" in lay and "copy" in lay["copy"]:
        for label in ("same_folder", "other_folder"):
            targets[f"copy ({label.replace('_', ' ')}): growth < {TARGET_COPY_GROWTH:.0%}"] = \
                lay["copy"]["copy"][label]["growth_pct"] < 100 * TARGET_COPY_GROWTH
    for name, r in lay.items():
        if "fsck" in r:
            targets[f"{name}: fsck clean"] = r["fsck"]["clean"]
        if "read" in r:
            targets[f"{name}: reads {'bit-exact' if res['lossy'] == 'off' else 'within budget'}"] = r["read"]["ok"]
    res["targets"] = targets


def write_outputs(res, results, slack):
    os.makedirs(results, exist_ok=True)
    stem = "layouts" if res["lossy"] != "off" else "layouts-lossless"
    h.write_json(os.path.join(results, stem + ".json"), res)
    run = res["run"]
    md = [f"### Checkpoint layouts ({res['size']}, {run['checkpoints']} checkpoints {run['save_every']} steps apart, "
          f"{run['state_bytes_per_checkpoint'] / 1e6:.1f} MB of model + optimizer state each; "
          f"lossy={res['lossy']}, mount options: {','.join(res['mount_options']) or 'defaults'})\n"]
    headers = ["layout", "logical MB", "store MB", "ratio", "ratio / one-folder", "delta versions", "fsck", "reads"]
    rows = []
    for name, r in res["layouts"].items():
        if r.get("status") == "failed":
            rows.append([name] + ["failed"] * (len(headers) - 1))
            continue
        v = r["versions"]
        rel = r.get("ratio_vs_one_folder")
        rd = r["read"]
        reads = ("bit-exact" if rd["bit_exact"] else
                 f"ok: {rd['max_rel_l2']['weights']:.3g} / {rd['max_step_rel_l2']:.3g} / "
                 f"{rd['max_elem_rel_exp_avg_sq']:.3g}" if rd["ok"] else "FAILED")
        rows.append([name, fmt_mb(r["logical_bytes"]), fmt_mb(r["store_bytes"]), f"{r['ratio']:.1f}x",
                     f"{rel:.2f}" if rel is not None else "-", f"{v['delta']} / {v['versions']}",
                     "clean" if r["fsck"]["clean"] else f"exit {r['fsck']['exit']}", reads])
    md.append(h.markdown_table(headers, rows))
    md.append(f"\nreads (after a read-only remount): bit-exact, or within budget with the largest errors seen: "
              f"weights' relative L2 (budget {res['budgets']['weights']:g}) / Adam's exp_avg's relative L2 on the "
              f"step m / (sqrt(v_hat) + 1e-8), for those not within {res['budgets']['opt']:g} on m itself "
              f"(momentum budget {res['budgets']['momentum']:g}) / exp_avg_sq's "
              f"largest per-element relative error (bound {res['budgets']['denominator']:g}).\n")
    zeroed = [n for n, r in res["layouts"].items()
              if r.get("read", {}).get("max_elem_rel_exp_avg_sq", 0) > res["budgets"]["denominator"] * slack]
    if zeroed:
        md.append(f"Not stored as optimizer denominators (an `exp_avg_sq` element came back {max(res['layouts'][n]['read']['max_elem_rel_exp_avg_sq'] for n in zeroed):.2g} "
                  f"off relative to its value, where the per-element bound is {res['budgets']['denominator']}; "
                  f"within the weights' L2 budget instead): {', '.join(zeroed)}.\n")
    md.append("\nratio = logical bytes of the retained files / `du -B1` of the backing directory after "
              "`ckptfs gc --grace 0`; the -keep3 rows are compared with one-folder-keep3, lightning (top-1) with "
              "one-folder-keep1. Delta versions: "
              "versions stored with a base / all versions stored as blobs (deleted ones included).\n")
    if "retention" in res:
        rt = res["retention"]
        md.append(f"\nRetention (newest 3 kept): hf-trainer-keep3 store {fmt_mb(rt['hf_trainer_keep3_store_bytes'])} MB, "
                  f"one-folder-keep3 {fmt_mb(rt['one_folder_keep3_store_bytes'])} MB: "
                  f"{rt['store_quotient']:.2f}x (target <= {rt['target']}x).\n")
    c = res["layouts"].get("copy", {}).get("copy")
    if c:
        md.append(f"\nByte-identical copies of a {fmt_mb(c['file_bytes'])} MB checkpoint (shutil.copy2): "
                  + "; ".join(f"{label.replace('_', ' ')}: store +{c[label]['store_growth_bytes'] / 1e3:.1f} kB "
                              f"({c[label]['growth_pct']:.2f} % of the file, "
                              f"{'delta' if c[label]['base'] else 'key frame'})" for label in ("same_folder", "other_folder"))
                  + f" (target < {TARGET_COPY_GROWTH:.0%}).\n")
    md.append("\nPer file (versions stored as delta / all, codec):\n")
    for name, r in res["layouts"].items():
        if "per_file" in r:
            md.append(f"- `{name}`: " + "; ".join(
                f"{p} {v['delta']}/{v['versions']} ({', '.join(v['codecs'])})" for p, v in r["per_file"].items()) + "\n")
    md.append("\nTargets (issue #24):\n")
    for k, ok in res["targets"].items():
        md.append(f"- {'met' if ok else 'MISSED'}: {k}\n")
    with open(os.path.join(results, stem + ".md"), "w") as f:
        f.write("".join(md))
