#!/usr/bin/python3
"""Which to code first, a version's weights or Adam's first moment? A numpy
sketch in closed loop, on the checkpoints of one run (docs/eval.md, "A
dithered first moment's symbols in the contexts").

  coding_order.py CKPT_DIR [--versions 12] [--dither 0.9] [--update-fraction 0.7]

CKPT_DIR holds ckpt_*.pt of a charlm run (e.g. an uninterrupted baseline of
exp_fault_tolerance.py). Per matrix, version by version against the previous
*reconstruction* (the first version taken as exact):
  now:   exp_avg in step space against its scaled base, dithered (uniform
         error, REL of the step), then the weights against a least-squares
         prediction from both first moments;
  other: the weights against the base's first moment alone, then exp_avg
         against its scaled base and the weights' reconstructed displacement.
The weights get a uniform quantizer whose error is the update fraction of
their update; rates are the symbols' empirical entropies (exp_avg's given its
dither's bucket of 16). Prints bits per parameter per version of each.
"""
import argparse
import glob
import os

import numpy as np
import torch


def entropy(q):
    _, c = np.unique(q, return_counts=True)
    p = c / c.sum()
    return float(-(p * np.log2(p)).sum())


def entropy_given(q, ctx):
    return sum(entropy(q[ctx == j]) * (ctx == j).sum() for j in np.unique(ctx)) / q.size


def fitted(cols, y):
    x = np.stack(cols, 1)
    c, *_ = np.linalg.lstsq(x, y, rcond=None)
    return x @ c


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ckpt_dir")
    ap.add_argument("--versions", type=int, default=12)
    ap.add_argument("--dither", type=float, default=0.9)
    ap.add_argument("--update-fraction", type=float, default=0.7)
    args = ap.parse_args()
    torch.set_num_threads(2)
    rng = np.random.default_rng(0)

    def code_moment(x, pred):
        step = args.dither * np.sqrt(12 * (x @ x) / x.size)
        d = rng.random(x.size) - 0.5
        q = np.round((x - pred) / step + d)
        ctx = np.minimum(((d + 0.5) * 16).astype(int), 15)
        return pred + (q - d) * step, entropy_given(q.astype(np.int64), ctx)

    def code_weights(w, pred, prev_hat):
        allowed = args.update_fraction * np.linalg.norm(w - prev_hat)
        r = w - pred
        if np.linalg.norm(r) <= allowed:
            return pred, 0.0
        lo, hi = 1e-12, 4 * np.abs(r).max() + 1e-12
        for _ in range(40):
            step = np.sqrt(lo * hi)
            if np.linalg.norm(r - np.round(r / step) * step) > allowed:
                hi = step
            else:
                lo = step
        q = np.round(r / lo)
        return pred + q * lo, entropy(q.astype(np.int64))

    files = sorted(glob.glob(os.path.join(args.ckpt_dir, "ckpt_*.pt")))[: args.versions]
    cks = [torch.load(f, map_location="cpu") for f in files]
    names = [n for n in cks[0]["model"].keys() if "mask" not in n]
    # The optimizer's parameter order: matrices (weight decay) first, as charlm.py groups them.
    order = [n for n in names if cks[0]["model"][n].dim() >= 2] + [n for n in names if cks[0]["model"][n].dim() < 2]
    matrices = [i for i, n in enumerate(order) if cks[0]["model"][n].dim() >= 2 and cks[0]["model"][n].numel() >= 4096]
    for scheme in ("now", "other"):
        bits_w = bits_m = 0.0
        count = 0
        for i in matrices:
            hat_w = hat_m = None
            for k, ck in enumerate(cks):
                w = ck["model"][order[i]].numpy().ravel().astype(np.float64)
                st = ck["optimizer"]["state"][i]
                s = np.sqrt(st["exp_avg_sq"].numpy().ravel().astype(np.float64)) + 1e-8
                x = st["exp_avg"].numpy().ravel() / s
                if k == 0:
                    hat_w, hat_m = w.copy(), x * s
                    continue
                base_x = hat_m / s
                if scheme == "now":
                    hx, rm = code_moment(x, fitted([base_x], x))
                    hw, rw = code_weights(w, hat_w + fitted([hat_w, hx, base_x], w - hat_w), hat_w)
                else:
                    hw, rw = code_weights(w, hat_w + fitted([hat_w, base_x], w - hat_w), hat_w)
                    hx, rm = code_moment(x, fitted([base_x, hw - hat_w, hat_w], x))
                if k >= 2:
                    bits_w += rw * w.size
                    bits_m += rm * w.size
                    count += w.size
                hat_w, hat_m = hw, hx * s
        print(f"{scheme}: weights {bits_w / count:.3f} exp_avg {bits_m / count:.3f} "
              f"sum {(bits_w + bits_m) / count:.3f} bits per parameter per version")


if __name__ == "__main__":
    main()
