"""README's results table from the JSON of codec_suite.py, fs_bench.py and
cluster_bench.py (one run of scripts/bench/results.sh), with the version,
the date and the command that made it.

  results_table.py --codec C.json --fs F.json --cluster K.json --sequence S.json --version "ckptfs X.Y.Z" --command CMD
"""
import argparse
import datetime
import json
import statistics


def codec_rows(d):
    threads = d["threads"]
    t = max(threads) if isinstance(threads, list) else int(threads)
    rows = []
    for name, w in d["workloads"].items():
        s = w["summary"]
        key = w["versions"][0]
        deltas = [v for v in w["versions"][1:]]
        enc_key = key["bytes"] / key[f"encode_s_t{t}"] / 1e6
        enc_delta = (sum(v["bytes"] for v in deltas) / sum(v[f"encode_s_t{t}"] for v in deltas) / 1e6) if deltas else None
        deepest = w["decodes"].get("deepest") or w["decodes"].get("v1")
        dec = deepest[f"decode_MBps_t{t}"] if deepest else None
        rows.append(f"| `{name}` | {w['bytes_per_version'] / 1e6:.0f} | {len(w['versions'])} | **{s['ratio']:.1f}x** | "
                    f"{s['zstd-3_ratio']:.2f}x | {enc_key:.0f} / {enc_delta:.0f} | "
                    f"{dec:.0f} (depth {deepest['chain_depth']}) | {s['zstd-1_encode_MBps']:.0f} / {s['zstd-1_decode_MBps']:.0f} |"
                    if enc_delta else "")
    return t, [r for r in rows if r]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--codec", required=True)
    ap.add_argument("--fs", required=True)
    ap.add_argument("--cluster", required=True)
    ap.add_argument("--sequence", required=True)
    ap.add_argument("--version", required=True)
    ap.add_argument("--command", required=True)
    a = ap.parse_args()
    codec = json.load(open(a.codec))
    fs = json.load(open(a.fs))
    cl = json.load(open(a.cluster))
    sq = json.load(open(a.sequence))
    t, rows = codec_rows(codec)
    out = [f"{a.version}, {datetime.date.today().isoformat()}, 2 cores, `{a.command}`.", ""]
    runs = codec.get("runs", 1)
    median = f", medians of {runs} runs" if runs > 1 else ""
    out += [f"**Checkpoint sequences** (`ckptfs encode`/`decode` on {t} threads, default level; "
            f"zstd on the same files{median}):", "",
            "| training run | MB per version | versions | ratio | zstd -3 ratio | encode MB/s, key / delta | "
            "decode MB/s, deepest | zstd -1 encode / decode MB/s |",
            "|---|---|---|---|---|---|---|---|"] + rows
    m = fs["medians"]
    pr = fs["paired_ratios"]["ckptfs_vs_passthrough"]
    out += ["", f"**Through the mount** ({fs['checkpoint_bytes'] / 1e6:.0f} MB model + Adam checkpoint, "
            f"`torch.save` / `torch.load`, medians of {fs['runs']} rounds; passthrough = ckptfs with `compress=off`):", "",
            "| | local disk | passthrough | ckptfs |", "|---|---|---|---|",
            f"| save (until close) | {m['disk']['save_s']:.2f} s | {m['passthrough']['save_s']:.2f} s | {m['ckptfs']['save_s']:.2f} s |",
            f"| until committed | {m['disk']['committed_s']:.2f} s | {m['passthrough']['committed_s']:.2f} s | {m['ckptfs']['committed_s']:.2f} s |",
            f"| load after remount | {m['disk']['load_s']:.2f} s | {m['passthrough']['load_s']:.2f} s | {m['ckptfs']['load_s']:.2f} s (paired {pr['load_s']:.2f}x passthrough) |"]
    later = sq["later_versions_medians"]
    load = {n: statistics.median(sq["raw"][n]["load_s"]) for n in ("disk", "passthrough", "ckptfs")}
    stored = {n: sum(sq["raw"][n]["stored_bytes"]) / 1e6 for n in ("disk", "passthrough", "ckptfs")}
    out += ["", f"**A training run in one mount** ({sq['versions']} versions of {sq['checkpoint_bytes'] / 1e6:.0f} MB, "
            "one Adam step apart, into `step-K/` of a mount that stays up; each loaded right after its commit):", "",
            "| | local disk | passthrough | ckptfs |", "|---|---|---|---|",
            f"| versions after the first, until committed | {later['disk']['committed_s']:.2f} s "
            f"| {later['passthrough']['committed_s']:.2f} s | {later['ckptfs']['committed_s']:.2f} s |",
            f"| load | {load['disk']:.2f} s | {load['passthrough']:.2f} s | {load['ckptfs']:.2f} s |",
            f"| stored, all versions | {stored['disk']:.0f} MB | {stored['passthrough']:.0f} MB | {stored['ckptfs']:.0f} MB "
            f"({sq['ratio']:.1f}x) |"]
    cm = cl["medians"]
    sp = cl["speedup_vs_gluster"]["ckptfs"]
    out += ["", f"**Shared store** (GlusterFS on loopback; {cl['checkpoint_bytes'] / 1e6:.0f} MB versions of one run "
            f"saved with fsync on node A, loaded on node B; medians of {cl['runs']} rounds):", "",
            "| | straight into GlusterFS | ckptfs on GlusterFS |", "|---|---|---|",
            f"| save + fsync (committed) | {cm['gluster']['committed_s']:.2f} s | {cm['ckptfs']['committed_s']:.2f} s "
            f"(paired speedup {sp['committed_s']['median']:.2f}x) |",
            f"| load on the other node | {cm['gluster']['load_s']:.2f} s | {cm['ckptfs']['load_s']:.2f} s |",
            f"| stored | {cm['gluster']['stored_bytes'] / 1e6:.0f} MB | {cm['ckptfs']['stored_bytes'] / 1e6:.0f} MB "
            f"({cl['ratio']['ckptfs']:.1f}x) |"]
    print("\n".join(out))


if __name__ == "__main__":
    main()
