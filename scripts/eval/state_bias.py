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
  positive (negative: the restored second moment is smaller).

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


def gains(original, restored):
    import torch
    m_num = m_den = u_num = u_den = 0.0
    log_sum, log_n = 0.0, 0
    for key, st in original["optimizer"]["state"].items():
        if "exp_avg" not in st or "exp_avg_sq" not in st:
            continue
        m, v = st["exp_avg"].double(), st["exp_avg_sq"].double()
        rs = restored["optimizer"]["state"][key]
        mr, vr = rs["exp_avg"].double(), rs["exp_avg_sq"].double()
        m_num += float((mr * m).sum())
        m_den += float((m * m).sum())
        u, ur = m / (v.sqrt() + 1e-8), mr / (vr.sqrt() + 1e-8)
        u_num += float((ur * u).sum())
        u_den += float((u * u).sum())
        both = (v > 0) & (vr > 0)
        log_sum += float(torch.log(vr[both] / v[both]).sum())
        log_n += int(both.sum())
    if m_den == 0:
        return None
    return {"m_gain": m_num / m_den, "step_gain": u_num / u_den if u_den else None,
            "v_log_ratio": log_sum / log_n if log_n else None}


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
            rows.append({"checkpoint": name, "chain_depth": len(chain) - 1, **g})
    if args.json:
        json.dump(rows, sys.stdout, indent=1)
        print()
        return 0
    print("| checkpoint | depth | m gain | step gain | mean log(v restored / v) |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['checkpoint']} | {r['chain_depth']} | {r['m_gain']:.3f} | {r['step_gain']:.3f} | "
              f"{r['v_log_ratio']:+.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
