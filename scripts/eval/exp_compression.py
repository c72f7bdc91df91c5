#!/usr/bin/python3
"""Experiment: compression over a training run, per checkpoint and
cumulative, weights and optimizer state apart.

  exp_compression.py --workload digits|charlm|transfer|resnet|finetune-bf16 [--size full|smoke]
      [--backends ckptfs-lossless,ckptfs-lossy:1e-2,...] [--workdir DIR]
      [--results DIR]

The seed-0 run trains once into a plain directory; its checkpoint sequence
(the exact bytes torch.save wrote, in order) is then replayed into each
backend, waiting for the encodes after each checkpoint as a trainer whose
save interval exceeds the encode time would. In an uninterrupted run the
bytes a trainer writes do not depend on where they go, so this is the same
as training into each mount, at a fraction of the cost. The weights /
optimizer split of ckptfs comes from the per-tensor stored bytes of
`ckptfs inspect --json` on the unmounted store (names model.* and
optimizer.*); with a build whose inspect lacks them, each checkpoint is
re-saved as {"model": ...} into weights/ and {"optimizer": ...} into optim/
and those files are stored and measured whole. zstd -3 compresses each whole
file, and for the split each tensor's raw bytes separately.

Writes RESULTS/compression-<workload>.json, .md and .png.
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

KINDS = ("checkpoint", "weights", "optimizer", "safetensors")
TARGET_RATIO = 40.0


def sequence(ckdir):
    """[(step, {kind: filename})] in save order."""
    out = []
    for name in sorted(os.listdir(ckdir)):
        if name.startswith("ckpt_") and name.endswith(".pt"):
            step = int(name[5:-3])
            files = {"checkpoint": name}
            st = f"model_{step:06d}.safetensors"
            if os.path.exists(os.path.join(ckdir, st)):
                files["safetensors"] = st
            out.append((step, files))
    return out


def tensor_bytes(obj):
    """Raw bytes of every tensor inside obj (dicts/lists walked)."""
    import torch
    if isinstance(obj, torch.Tensor):
        t = obj.detach().contiguous()
        return [t.reshape(-1).view(torch.uint8).numpy().tobytes()] if t.numel() else []
    if isinstance(obj, dict):
        return [b for k in obj for b in tensor_bytes(obj[k])]
    if isinstance(obj, (list, tuple)):
        return [b for v in obj for b in tensor_bytes(v)]
    return []


def zstd_size(data):
    return len(subprocess.run(["zstd", "-3", "-q", "-c"], input=data, capture_output=True, check=True).stdout)


def write_split_files(ckdir, seq, splitdir):
    """{"model": ...} into splitdir/weights, {"optimizer": ...} into splitdir/optim."""
    import torch
    if os.path.isdir(splitdir):
        return
    for sub in ("weights", "optim"):
        os.makedirs(os.path.join(splitdir, sub))
    for _, files in seq:
        ck = torch.load(os.path.join(ckdir, files["checkpoint"]))
        torch.save({"model": ck["model"]}, os.path.join(splitdir, "weights", files["checkpoint"]))
        torch.save({"optimizer": ck["optimizer"]}, os.path.join(splitdir, "optim", files["checkpoint"]))


def zstd_rows(ckdir, seq):
    """zstd -3 per whole file, and per tensor (raw bytes) for the split."""
    import torch
    rows = []
    for step, files in seq:
        row = {"step": step}
        for kind, name in files.items():
            with open(os.path.join(ckdir, name), "rb") as f:
                data = f.read()
            row[kind] = {"logical_bytes": len(data), "stored_bytes": zstd_size(data)}
        ck = torch.load(os.path.join(ckdir, files["checkpoint"]))
        for kind, key in (("weights", "model"), ("optimizer", "optimizer")):
            blobs = tensor_bytes(ck[key])
            row[kind] = {"logical_bytes": sum(len(b) for b in blobs),
                         "stored_bytes": sum(zstd_size(b) for b in blobs)}
        rows.append(row)
    return rows


def _copy_in_order(backend, root, pairs):
    """Copies (source, destination) groups in order, waiting for the encodes
    after each group."""
    for group in pairs:
        for src, dst in group:
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copyfile(src, dst)
        backend.wait_idle()


def per_tensor_split(backend, relpath):
    """{weights, optimizer, other} logical/stored bytes of one stored
    checkpoint from the per-tensor numbers of `ckptfs inspect --json`, or
    None when this build's inspect does not give them."""
    try:
        info = backend.inspect(relpath)
    except (subprocess.CalledProcessError, ValueError):
        return None
    tensors = info.get("blob", {}).get("tensors")
    if not tensors or "stored_bytes" not in tensors[0]:
        return None
    out = {k: {"logical_bytes": 0, "stored_bytes": 0} for k in ("weights", "optimizer", "other")}
    out["modules"] = {}
    for t in tensors:
        # Weights per module (model.conv1, model.blocks, ...): frozen layers show up here.
        if t["name"].startswith("model."):
            m = out["modules"].setdefault(".".join(t["name"].split(".")[:2]), {"logical_bytes": 0, "stored_bytes": 0})
            m["logical_bytes"] += t["logical_bytes"]
            m["stored_bytes"] += t["stored_bytes"]
        kind = ("weights" if t["name"].startswith("model.") else
                "optimizer" if t["name"].startswith("optimizer.") else "other")
        out[kind]["logical_bytes"] += t["logical_bytes"]
        out[kind]["stored_bytes"] += t["stored_bytes"]
    v = info["blob"].get("verbatim", {})
    out["other"]["logical_bytes"] += v.get("logical_bytes", 0)
    out["other"]["stored_bytes"] += v.get("stored_bytes", 0)
    return out


def replay(backend, workdir, ckdir, splitdir, seq):
    """Replays the run into `backend`; returns (rows, how the split was measured)."""
    root = backend.start(workdir)
    try:
        _copy_in_order(backend, root, [[(os.path.join(ckdir, n), os.path.join(root, "run", n))
                                        for n in files.values()] for _, files in seq])
        backend.stop()
    except BaseException:
        backend.teardown()
        raise
    stats = backend.stats()
    rows = []
    for step, files in seq:
        row = {"step": step}
        for kind, name in files.items():
            row[kind] = _pick(stats[os.path.join("run", name)])
        rows.append(row)
    splits = [per_tensor_split(backend, os.path.join("run", files["checkpoint"])) for _, files in seq]
    if all(splits):
        for row, sp in zip(rows, splits):
            row.update(sp)  # weights, optimizer, other, modules
        return rows, "per-tensor stored bytes of `ckptfs inspect --json` (tensor data only)"
    # No per-tensor numbers: store {"model"} and {"optimizer"} files apart.
    write_split_files(ckdir, seq, splitdir)
    root = backend.start(workdir)
    try:
        _copy_in_order(backend, root, [[(os.path.join(splitdir, sub, files["checkpoint"]),
                                         os.path.join(root, sub, files["checkpoint"])) for sub in ("weights", "optim")]
                                       for _, files in seq])
        backend.stop()
    except BaseException:
        backend.teardown()
        raise
    stats = backend.stats()
    for row, (step, files) in zip(rows, seq):
        row["weights"] = _pick(stats[os.path.join("weights", files["checkpoint"])])
        row["optimizer"] = _pick(stats[os.path.join("optim", files["checkpoint"])])
    return rows, "separate {model} / {optimizer} files in their own directories (whole files)"


def _pick(s):
    out = {"logical_bytes": s["logical_bytes"], "stored_bytes": s["stored_bytes"]}
    for key in ("codec", "chain_depth"):  # how the store encoded it (blob:opaque = not parsed)
        if key in s:
            out[key] = s[key]
    return out


def summarize(rows):
    """Per kind: total logical/stored, cumulative ratio, and the cumulative
    ratio series over the run. 'weights+optimizer' adds the two."""
    out = {}
    for kind in KINDS + ("weights+optimizer",):
        parts = ("weights", "optimizer") if kind == "weights+optimizer" else (kind,)
        if not all(p in rows[0] for p in parts):
            continue
        logical = stored = 0
        series = []
        for r in rows:
            logical += sum(r[p]["logical_bytes"] for p in parts)
            stored += sum(r[p]["stored_bytes"] for p in parts)
            series.append(logical / stored)
        out[kind] = {"logical_bytes": logical, "stored_bytes": stored, "ratio": logical / stored,
                     "cumulative": series}
    if "modules" in rows[0]:
        mods = {}
        for r in rows:
            for name, m in r["modules"].items():
                acc = mods.setdefault(name, {"logical_bytes": 0, "stored_bytes": 0})
                acc["logical_bytes"] += m["logical_bytes"]
                acc["stored_bytes"] += m["stored_bytes"]
        for m in mods.values():
            m["ratio"] = m["logical_bytes"] / max(1, m["stored_bytes"])
        out["modules"] = mods
    return out


def _size(n):
    return f"{n / 1e6:.1f} MB" if n >= 1e6 else f"{n / 1e3:.1f} kB"


def fmt_ratio(x):
    return f"{x:.1f}x" if x >= 10 else f"{x:.2f}x"


def write_outputs(res, results):
    base = os.path.join(results, f"compression-{res['workload']}")
    h.write_json(base + ".json", res)
    kinds = ["checkpoint", "weights", "optimizer", "weights+optimizer", "safetensors"]
    have = [k for k in kinds if any(k in b.get("summary", {}) for b in res["backends"].values())]
    headers = ["backend"] + [f"{k} (cumulative)" for k in have] + ["last ckpt (per file)", "≥40x (w+opt)"]
    rows = []
    for name, b in res["backends"].items():
        if b["status"] != "ok":
            rows.append([name] + [b["status"]] * (len(headers) - 1))
            continue
        s = b["summary"]
        last = b["per_checkpoint"][-1]["checkpoint"]
        wo = s.get("weights+optimizer", {}).get("ratio", 0)
        rows.append([name] + [fmt_ratio(s[k]["ratio"]) if k in s else "-" for k in have]
                    + [fmt_ratio(last["logical_bytes"] / last["stored_bytes"]),
                       "yes" if wo >= TARGET_RATIO else f"no ({fmt_ratio(wo)})"])
    md = [f"### Compression: {res['workload']} ({res['size']}, {res['checkpoints']} checkpoints, "
          f"{res['logical_bytes_per_checkpoint'] / 1e6:.2f} MB each)\n", h.markdown_table(headers, rows)]
    for name, b in res["backends"].items():
        if b["status"] != "ok":
            md.append(f"- `{name}`: {b['status']} — {b['reason'].splitlines()[0]}\n")
            continue
        if b.get("note"):
            md.append(f"- `{name}`: {b['note']}\n")
        if b.get("split_measured_by"):
            md.append(f"- `{name}`: weights/optimizer split from {b['split_measured_by']}\n")
        if "modules" in b["summary"]:
            mods = b["summary"]["modules"]
            md.append(f"- `{name}`: weights per module, cumulative: " + ", ".join(
                f"{m} {fmt_ratio(v['ratio'])} (of {_size(v['logical_bytes'])})" for m, v in mods.items()) + "\n")
        codecs = sorted({r[k]["codec"] for r in b["per_checkpoint"] for k in KINDS if k in r and "codec" in r[k]})
        if codecs:
            md.append(f"- `{name}`: stored as {', '.join(codecs)}\n")
    with open(base + ".md", "w") as f:
        f.write("\n".join(md[:2]) + "\n" + "".join(md[2:]))

    plt = h.pyplot()
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FuncFormatter, NullFormatter
    backends = [(name, b) for name, b in res["backends"].items() if b["status"] == "ok"]
    # One legend under the panels: the backends' names are long.
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6 + 0.22 * len(backends)))
    handles = []
    for i, (name, b) in enumerate(res["backends"].items()):
        if b["status"] != "ok":
            continue
        color = f"C{i}"
        steps = [r["step"] for r in b["per_checkpoint"]]
        per = [r["checkpoint"]["logical_bytes"] / r["checkpoint"]["stored_bytes"] for r in b["per_checkpoint"]]
        handles.append(axes[0].plot(steps, per, marker=".", color=color, label=h.short_backend(name))[0])
        axes[1].plot(steps, b["summary"]["checkpoint"]["cumulative"], marker=".", color=color)
        axes[2].plot(steps, b["summary"]["weights"]["cumulative"], "-", color=color)
        axes[2].plot(steps, b["summary"]["optimizer"]["cumulative"], "--", color=color)
    titles = ("whole checkpoint, per file", "whole checkpoint, cumulative",
              "weights (solid) / optimizer (dashed), cumulative")
    for ax, title in zip(axes, titles):
        low, high = ax.get_ylim()
        if high > 20 * max(low, 0.5):  # log scale only when the ratios span decades
            ax.set_yscale("log")
            ax.yaxis.set_minor_formatter(NullFormatter())
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
        ax.set_xlabel("training step")
        ax.set_ylabel("logical / stored bytes")
        ax.set_title(f"{res['workload']}: {title}", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
    styles = [Line2D([], [], color="grey", linestyle="-", label="weights"),
              Line2D([], [], color="grey", linestyle="--", label="optimizer")]
    legend_rows = (len(handles) + 2 + 1) // 2
    fig.legend(handles=handles + styles, loc="lower center", ncol=2, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.045 * legend_rows * 4.6 / fig.get_figheight() * 1.1, 1, 1))
    fig.savefig(base + ".png", dpi=100)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", required=True, choices=h.WORKLOADS)
    ap.add_argument("--size", default="full", choices=["full", "smoke"])
    ap.add_argument("--backends", default="ckptfs-lossless,ckptfs-lossy:1e-2,ckptfs-lossy:1e-2:1e-2,ckptfs-lossy:5e-2,ckptfs-lossy:1e-1")
    ap.add_argument("--workdir", default="/tmp/ckptfs-eval")
    ap.add_argument("--results", default="results")
    args = ap.parse_args()

    base = h.baseline_run(args.workdir, args.workload, args.size, 0)
    seq = sequence(base["ckpts"])
    expdir = os.path.join(args.workdir, f"{args.workload}-{args.size}", "compression")
    shutil.rmtree(expdir, ignore_errors=True)
    splitdir = os.path.join(expdir, "split")
    h.log(f"[compression {args.workload}] zstd -3 over {len(seq)} checkpoints")
    res = {"experiment": "compression", "workload": args.workload, "size": args.size,
           "date": datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M UTC"), "cpus": os.cpu_count(),
           "schedule": h.schedule(args.workload, args.size), "checkpoints": len(seq),
           "logical_bytes_per_checkpoint": os.path.getsize(os.path.join(base["ckpts"], seq[-1][1]["checkpoint"])),
           "backends": {}}
    zrows = zstd_rows(base["ckpts"], seq)
    res["backends"]["zstd -3 (per file; per tensor for the split)"] = {
        "status": "ok", "per_checkpoint": zrows, "summary": summarize(zrows)}
    failed = False
    for spec, b, work in bk.runnable(args.backends, expdir, res, h.log, f"compression {args.workload}"):
        h.log(f"[compression {args.workload}] replaying into {spec}")
        try:
            rows, split_how = replay(b, work, base["ckpts"], splitdir, seq)
        except (RuntimeError, OSError, KeyError, subprocess.SubprocessError) as e:
            h.log(f"[compression {args.workload}] {spec}: FAILED: {e!r}")
            res["backends"][spec] = {"status": "failed", "reason": repr(e)[-2000:]}
            failed = True
            continue
        res["backends"][spec] = {"status": "ok", "per_checkpoint": rows, "summary": summarize(rows),
                                 "split_measured_by": split_how,
                                 "mount_options": b.options, "note": getattr(b, "note", None)}
        shutil.rmtree(work, ignore_errors=True)
    write_outputs(res, args.results)
    h.log(f"[compression {args.workload}] wrote {args.results}/compression-{args.workload}.{{json,md,png}}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
