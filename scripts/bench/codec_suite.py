"""Runs the codec benchmark suite (make_suite.py's checkpoints) through the
`ckptfs encode` / `ckptfs decode` commands, as a user would, side by side with
the zstd command at levels 1 and 3 on the same files in the same run.

  codec_suite.py --ckptfs BIN --suite DIR [--runs 3] [--threads 1,2]
                 [--only NAME,...] [--budget 0.01] [--work DIR] [--markdown] [--stages]
  codec_suite.py --from-json RESULT.json   (the tables of an earlier run)

Per workload (a sequence v0, v1, ... of one training run) and thread count:
v0 encoded as a key frame, each later version as a delta frame against the
previous one (its chain given as --base), then v1 and the deepest version
decoded with their chains. Every figure is a wall-clock median of --runs
calls of the command (input and output files included, as for zstd), in MB/s
of the checkpoint's bytes; `vs_zstd1` is ckptfs's time over zstd -1's (encode)
or zstd -d's (decode) on the same file: below 1 means faster. Prints one JSON
object; --markdown prints a table of it instead.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def timed(cmd, runs, output=None):
    """Median wall seconds of `runs` calls; raises on a failed call. With
    `output` (a list), the last call's standard output is appended to it."""
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        times.append(time.perf_counter() - t0)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}: exit {r.returncode}: {r.stderr.decode(errors='replace')[-2000:]}")
    if output is not None:
        output.append(r.stdout.decode(errors="replace"))
    return statistics.median(times)


def parse_stages(text):
    for line in text.splitlines():
        if line.startswith("stages: "):
            return json.loads(line[len("stages: "):])
    return None


def mbps(nbytes, seconds):
    return round(nbytes / seconds / 1e6, 1) if seconds > 0 else None


def bench_zstd(path, work, runs):
    size = os.path.getsize(path)
    out = {}
    for level in (1, 3):
        z = os.path.join(work, f"z{level}.zst")
        back = os.path.join(work, f"z{level}.out")
        enc = timed(["zstd", "-q", "-f", f"-{level}", "-T1", path, "-o", z], runs)
        dec = timed(["zstd", "-q", "-f", "-d", z, "-o", back], runs)
        out[f"zstd-{level}"] = {"ratio": round(size / os.path.getsize(z), 3), "encode_s": enc, "decode_s": dec,
                                "encode_MBps": mbps(size, enc), "decode_MBps": mbps(size, dec)}
        os.remove(back)
    return out


def bench_workload(ckptfs, wdir, work, runs, threads, budget, stages):
    versions = sorted((f for f in os.listdir(wdir) if f.startswith("v") and f.endswith(".pt")),
                      key=lambda f: int(f[1:-3]))
    info = {}
    if os.path.exists(os.path.join(wdir, "INFO.json")):
        with open(os.path.join(wdir, "INFO.json")) as f:
            info = json.load(f)
    blobs = []
    files = []
    for k, name in enumerate(versions):
        path = os.path.join(wdir, name)
        size = os.path.getsize(path)
        blob = os.path.join(work, f"v{k}.blob")
        chain = list(reversed(blobs))  # the previous version first, then its bases
        entry = {"file": name, "bytes": size, "frame": "delta" if chain else "key"}
        for t in threads:
            cmd = [ckptfs, "encode", "--threads", str(t), "--budget", str(budget), path, blob]
            for b in chain:
                cmd += ["--base", b]
            output = []
            if t == threads[0] and stages:
                cmd.append("--stages")
            entry[f"encode_s_t{t}"] = timed(cmd, runs, output)
            entry[f"encode_MBps_t{t}"] = mbps(size, entry[f"encode_s_t{t}"])
            if t == threads[0] and stages:
                entry["stages"] = parse_stages(output[0])
        entry["stored_bytes"] = os.path.getsize(blob)
        entry["ratio"] = round(size / entry["stored_bytes"], 3)
        entry.update(bench_zstd(path, work, runs))
        entry["encode_vs_zstd1"] = round(entry[f"encode_s_t{threads[0]}"] / entry["zstd-1"]["encode_s"], 2)
        blobs.append(blob)
        files.append(entry)
    # Decode v1 (one delta over the key frame) and the deepest version, each
    # with its whole chain, and check the bytes (lossless formats' framing,
    # the tensors' values within budget are the unit tests' business).
    decodes = {}
    for k in sorted({min(1, len(blobs) - 1), len(blobs) - 1}):
        out = os.path.join(work, "decoded")
        size = files[k]["bytes"]
        d = {"version": k, "chain_depth": k}
        for t in threads:
            cmd = [ckptfs, "decode", blobs[k], out] + (["--threads", str(t)] if t > 1 else [])
            for b in reversed(blobs[:k]):
                cmd += ["--base", b]
            d[f"decode_s_t{t}"] = timed(cmd, runs)
            d[f"decode_MBps_t{t}"] = mbps(size, d[f"decode_s_t{t}"])
        if os.path.getsize(out) != size:
            raise RuntimeError(f"decode of {versions[k]}: {os.path.getsize(out)} bytes, want {size}")
        d["decode_vs_zstd_d"] = round(d[f"decode_s_t{threads[0]}"] / files[k]["zstd-1"]["decode_s"], 2)
        os.remove(out)
        decodes["deepest" if k == len(blobs) - 1 and k > 1 else f"v{k}"] = d
    logical = sum(f["bytes"] for f in files)
    stored = sum(f["stored_bytes"] for f in files)
    key = files[0]
    deltas = files[1:]
    t0 = threads[0]
    summary = {
        "ratio": round(logical / stored, 3),
        "zstd-1_ratio": round(logical / sum(f["bytes"] / f["zstd-1"]["ratio"] for f in files), 3),
        "zstd-3_ratio": round(logical / sum(f["bytes"] / f["zstd-3"]["ratio"] for f in files), 3),
        "key_encode_MBps": key[f"encode_MBps_t{t0}"],
        "key_encode_vs_zstd1": key["encode_vs_zstd1"],
        "delta_encode_MBps": round(statistics.median(f[f"encode_MBps_t{t0}"] for f in deltas), 1) if deltas else None,
        "delta_encode_vs_zstd1": round(statistics.median(f["encode_vs_zstd1"] for f in deltas), 2) if deltas else None,
        "zstd-1_encode_MBps": statistics.median(f["zstd-1"]["encode_MBps"] for f in files),
        "zstd-1_decode_MBps": statistics.median(f["zstd-1"]["decode_MBps"] for f in files),
    }
    for name, d in decodes.items():
        summary[f"decode_{name}_MBps"] = d[f"decode_MBps_t{t0}"]
        summary[f"decode_{name}_vs_zstd_d"] = d["decode_vs_zstd_d"]
    if len(threads) > 1:
        tn = threads[-1]
        summary[f"encode_scaling_t{tn}"] = round(
            statistics.median(f[f"encode_s_t{t0}"] / f[f"encode_s_t{tn}"] for f in files), 2)
        summary[f"decode_scaling_t{tn}"] = round(
            statistics.median(d[f"decode_s_t{t0}"] / d[f"decode_s_t{tn}"] for d in decodes.values()), 2)
    if files[0].get("stages"):
        def total(entries):
            out = {}
            for e in entries:
                for name, st in e["stages"].items():
                    acc = out.setdefault(name, {"seconds": 0.0, "chunks": 0, "kept": 0, "saved_bytes": 0})
                    for k in acc:
                        acc[k] += st[k]
            return out
        summary["stages_key"] = total(files[:1])
        summary["stages_deltas"] = total(files[1:])
        summary["encode_s_key"] = files[0][f"encode_s_t{t0}"]
        summary["encode_s_deltas"] = sum(f[f"encode_s_t{t0}"] for f in files[1:])
    return {"description": info.get("description", ""), "steps": info.get("steps"), "bytes_per_version": key["bytes"],
            "summary": summary, "versions": files, "decodes": decodes}


def markdown(result):
    t0 = result["threads"][0]
    rows = ["| workload | MB/version | ratio | zstd -3 ratio | key enc MB/s (x zstd -1 time) | "
            "delta enc MB/s (x) | decode v1 MB/s (x zstd -d) | deepest decode MB/s (x) | 2-thread scaling enc / dec |",
            "|---|---|---|---|---|---|---|---|---|"]
    for name, w in result["workloads"].items():
        s = w["summary"]
        deep = (f"{s['decode_deepest_MBps']} ({s['decode_deepest_vs_zstd_d']})"
                if "decode_deepest_MBps" in s else "-")
        scaling = "-"
        if len(result["threads"]) > 1:
            tn = result["threads"][-1]
            scaling = f"{s[f'encode_scaling_t{tn}']} / {s[f'decode_scaling_t{tn}']}"
        rows.append(f"| {name} | {w['bytes_per_version'] / 1e6:.0f} | {s['ratio']} | {s['zstd-3_ratio']} | "
                    f"{s['key_encode_MBps']} ({s['key_encode_vs_zstd1']}) | "
                    f"{s['delta_encode_MBps']} ({s['delta_encode_vs_zstd1']}) | "
                    f"{s['decode_v1_MBps']} ({s['decode_v1_vs_zstd_d']}) | {deep} | {scaling} |")
    return "\n".join(rows) + f"\n\nOne core = `--threads {t0}`; (x) = ckptfs's time over zstd's on the same file.\n"


def stage_markdown(result):
    """Per workload and frame kind: the share of the encode's wall time per
    stage, and for the candidates how often they were kept and what they saved."""
    names = ["base_read", "prediction", "lossy", "row_column", "low_rank", "stored_pass"]
    rows = ["| workload | frames | " + " | ".join(names) + " | other | row_column kept (saved) | low_rank kept (saved) |",
            "|---|---|" + "---|" * (len(names) + 3)]
    for wname, w in result["workloads"].items():
        s = w["summary"]
        if "stages_key" not in s:
            continue
        for kind, stages, wall in (("key", s["stages_key"], s["encode_s_key"]),
                                   ("deltas", s["stages_deltas"], s["encode_s_deltas"])):
            if wall <= 0:
                continue
            shares = [stages[n]["seconds"] / wall for n in names]
            cand = [f"{stages[n]['kept']}/{stages[n]['chunks']} ({stages[n]['saved_bytes'] / 1e6:.2f} MB)"
                    for n in ("row_column", "low_rank")]
            rows.append(f"| {wname} | {kind} | " + " | ".join(f"{x:.0%}" for x in shares) +
                        f" | {max(0.0, 1 - sum(shares)):.0%} | {cand[0]} | {cand[1]} |")
    return "\n".join(rows) + "\n\nShares of the command's wall time (one thread); other = reading the input, " \
        "planning, writing the blob, process start.\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckptfs")
    ap.add_argument("--suite")
    ap.add_argument("--from-json", help="print the tables of an earlier run's JSON instead of running")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--only", default="")
    ap.add_argument("--budget", type=float, default=0.01, help="the mount's default lossy budget")
    ap.add_argument("--work", default=None, help="scratch directory for blobs (default: a temporary one)")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--stages", action="store_true",
                    help="also report each encode's time per stage (ckptfs encode --stages, one thread)")
    args = ap.parse_args()
    if args.from_json:
        with open(args.from_json) as f:
            result = json.load(f)
        print(markdown(result))
        print(stage_markdown(result))
        return
    if not args.ckptfs or not args.suite:
        sys.exit("codec_suite: --ckptfs and --suite are needed (or --from-json)")
    if shutil.which("zstd") is None:
        sys.exit("codec_suite: the zstd command is needed for the side-by-side figures")
    threads = [int(t) for t in args.threads.split(",") if t]
    names = sorted(d for d in os.listdir(args.suite) if os.path.isdir(os.path.join(args.suite, d)))
    if args.only:
        names = [n for n in names if n in args.only.split(",")]
    result = {"budget": args.budget, "runs": args.runs, "threads": threads, "workloads": {}}
    for name in names:
        with tempfile.TemporaryDirectory(dir=args.work) as work:
            print(f"codec_suite: {name}", file=sys.stderr, flush=True)
            result["workloads"][name] = bench_workload(args.ckptfs, os.path.join(args.suite, name), work,
                                                       args.runs, threads, args.budget, args.stages)
    if args.markdown:
        print(markdown(result))
        if args.stages:
            print(stage_markdown(result))
    else:
        print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
