#!/usr/bin/python3
"""Is the optimizer state ckptfs gives back biased? Encodes the first
checkpoints of a run as one delta chain with the default budget (`ckptfs
encode --base ...`, as the mount would chain them), decodes each, and
reports for Adam's state, over all its tensors:

- m gain: <m_restored, m> / <m, m> (1 = no shrinkage; a quantizer that
  minimizes the squared error shrinks: about 1 - rel_l2^2 at its budget);
- step gain: the same for the step u = m / (sqrt(v) + eps) (what the first
  update after a restore moves the weights by, relative to the original);
- v log ratio: the mean of log(v_restored / v) over elements with both
  positive (negative: the restored second moment is smaller);
- ratio: the checkpoint's bytes over its blob's (and, last, the chain's).

  state_bias.py CKPT_DIR [--count 10] [--budget 0.01] [--json]

CKPT_DIR holds train.py's ckpt_*.pt. The binary comes from $CKPTFS_BIN
(default build/mount-tools/ckptfs).
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CKPTFS = os.environ.get("CKPTFS_BIN", os.path.join(REPO, "build", "mount-tools", "ckptfs"))


def moment_bias(state, restored_state):
    """Sums of one parameter's Adam state against its restored copy:
    m_energy <m, m>, m_dot <m_restored, m>, u_energy and u_dot the same for
    the step u = m / (sqrt(v) + eps), v_log_sum the sum of log(v_restored /
    v) over the v_count elements where both are positive."""
    import torch
    m, v = state["exp_avg"].double(), state["exp_avg_sq"].double()
    mr, vr = restored_state["exp_avg"].double(), restored_state["exp_avg_sq"].double()
    u, ur = m / (v.sqrt() + 1e-8), mr / (vr.sqrt() + 1e-8)
    both = (v > 0) & (vr > 0)
    return {"m_energy": float((m * m).sum()), "m_dot": float((mr * m).sum()),
            "u_energy": float((u * u).sum()), "u_dot": float((ur * u).sum()),
            "v_log_sum": float(torch.log(vr[both] / v[both]).sum()), "v_count": int(both.sum())}


def gains(original, restored):
    total = {}
    for key, st in original["optimizer"]["state"].items():
        if "exp_avg" not in st or "exp_avg_sq" not in st:
            continue
        for k, x in moment_bias(st, restored["optimizer"]["state"][key]).items():
            total[k] = total.get(k, 0) + x
    if not total.get("m_energy"):
        return None
    return {"m_gain": total["m_dot"] / total["m_energy"],
            "step_gain": total["u_dot"] / total["u_energy"] if total["u_energy"] else None,
            "v_log_ratio": total["v_log_sum"] / total["v_count"] if total["v_count"] else None}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ckpt_dir")
    ap.add_argument("--count", type=int, default=10)
    ap.add_argument("--budget", type=float, default=0.01)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    import torch
    torch.set_num_threads(1)
    files = sorted(glob.glob(os.path.join(args.ckpt_dir, "ckpt_*.pt")))[:args.count]
    if not files:
        raise SystemExit(f"no ckpt_*.pt in {args.ckpt_dir}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        chain = []  # newest first, as `--base` takes them
        for f in files:
            name = os.path.basename(f)[:-3]
            blob = os.path.join(tmp, name + ".blob")
            bases = [a for b in chain for a in ("--base", b)]
            subprocess.run([CKPTFS, "encode", "-q", "--budget", str(args.budget), *bases, f, blob], check=True,
                           capture_output=True)
            decoded = os.path.join(tmp, name + ".decoded.pt")
            subprocess.run([CKPTFS, "decode", "-q", *bases, blob, decoded], check=True, capture_output=True)
            chain.insert(0, blob)
            g = gains(torch.load(f), torch.load(decoded))
            os.remove(decoded)
            if g is None:
                raise SystemExit(f"{f}: no Adam state (exp_avg, exp_avg_sq)")
            rows.append({"checkpoint": name, "chain_depth": len(chain) - 1, **g,
                         "bytes": os.path.getsize(f), "blob_bytes": os.path.getsize(blob)})
    total = sum(r["bytes"] for r in rows) / sum(r["blob_bytes"] for r in rows)
    if args.json:
        json.dump({"checkpoints": rows, "ratio": total}, sys.stdout, indent=1)
        print()
        return 0
    print("| checkpoint | depth | m gain | step gain | mean log(v restored / v) | ratio |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['checkpoint']} | {r['chain_depth']} | {r['m_gain']:.3f} | {r['step_gain']:.3f} | "
              f"{r['v_log_ratio']:+.3f} | {r['bytes'] / r['blob_bytes']:.1f}x |")
    print(f"\nchain of {len(rows)}: {total:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
