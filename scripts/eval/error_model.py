#!/usr/bin/python3
"""A numpy model of the lossy codec, for choosing error measures and budgets
before building them: restore-and-resume in one process, minutes per variant.

  error_model.py --workload digits|charlm [--seed S]
      [--budget 1e-2] [--schedule dsq|off]            weights (rel. L2)
      [--weights l2|fisher]
      [--momentum-budget 0.2] [--momentum l2|step|step-prune|zero]
      [--second-moment-budget 0.2]                     exp_avg_sq (max_rel)
      [--keyframe 10] [--uninterrupted]

Trains the workload in-process with the schedule of exp_fault_tolerance.py
(harness.SCHEDULES, full size). At every checkpoint the weights, Adam's
exp_avg and exp_avg_sq go through a model of the codec: per tensor a delta
chain against the previous *reconstruction*, a key frame every --keyframe
versions (and whenever it is smaller), the budget schedule (a tensor equal
to its previous version keeps its budget), an entropy-coded dead-zone uniform
quantizer searched for the smallest entropy within the budget (L2 budgets),
and a geometric grid with ratio 1 + 1.9 max_rel (the log mode of
exp_avg_sq). At every restore point the live state is replaced by the
reconstructions, as a resume from the mount would (--uninterrupted: neither,
the run to compare with). The defaults are the mount's of 2026-11-30
(docs/policy.md has today's: exp_avg_sq at max_rel 0.4, exp_avg at 0.5 on
Adam's step, a finer-spaced log grid, since 2026-12-01).
Prints one JSON line: the
final metric and the modelled ratio of weights, exp_avg and exp_avg_sq
(entropy bound plus 8 bytes per tensor; the real codec's ratio is lower,
about 0.8-0.9 of it, and the differences between variants are what it is for).

Error measures (the relative budget is over the weighted sum of squares):
  weights l2        sum (w - w^)^2 <= b^2 sum w^2      (the codec today)
  weights fisher    sum v (w - w^)^2 <= b^2 sum v w^2  (v = exp_avg_sq:
                    Adam's diagonal Fisher estimate), decoder scales by sqrt(v^)
  momentum l2       sum (m - m^)^2 <= b^2 sum m^2      (the codec today)
  momentum step     the same on the step m / (sqrt(v^) + eps): the decoder
                    would need the second moment's reconstruction v^
  momentum step-prune  encoder only (today's stream format): levels uniform
                    in m, elements pruned by their step-space importance
  momentum zero     exp_avg not stored (restored as zeros)
"""
import argparse
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402

EPS = 1e-8               # Adam's eps
DEAD_ZONES = (1.0, 1.5, 2.0, 3.0)
BISECT_STEPS = 22
TENSOR_OVERHEAD_BITS = 64


def entropy_bits(symbols):
    _, counts = np.unique(symbols, return_counts=True)
    return float(-(counts * np.log2(counts / symbols.size)).sum())


def quantize(r, target, weight=None, prune=None):
    """Smallest-entropy dead-zone uniform quantization of r whose weighted
    squared error is within `target`. `prune` (bool mask) forces elements to
    symbol 0. Returns (reconstruction of r, bits)."""
    w = np.ones_like(r) if weight is None else weight
    if float((w * r * r).sum()) <= target:
        return np.zeros_like(r), 0.0
    amax = float(np.abs(r).max())
    best = None
    for zone in DEAD_ZONES if prune is None else (1.0,):
        def symbols(step):
            q = np.round(r / step)
            q[np.abs(r) < zone * step / 2] = 0
            if prune is not None:
                q[prune] = 0
            return q
        lo, hi = amax * 1e-7, amax * 4
        for _ in range(BISECT_STEPS):
            step = math.sqrt(lo * hi)
            if float((w * (r - symbols(step) * step) ** 2).sum()) <= target:
                lo = step
            else:
                hi = step
        q = symbols(lo)
        bits = entropy_bits(q.astype(np.int64))
        if best is None or bits < best[1]:
            best = (q * lo, bits)
    return best


def prune_by_importance(importance, allowance):
    """The elements of least importance whose sum stays within `allowance`."""
    order = np.argsort(importance)
    k = int(np.searchsorted(np.cumsum(importance[order]), allowance))
    mask = np.zeros(importance.size, bool)
    mask[order[:k]] = True
    return mask


class Chain:
    """One tensor's versions: the base is the previous reconstruction."""

    def __init__(self, keyframe):
        self.keyframe, self.base, self.count = keyframe, None, 0
        self.source = None  # the previous version's original (the codec keeps its digest)

    def encode_l2(self, x, budget, measure="l2", weight=None, schedule="off"):
        key = self.base is None or self.count % self.keyframe == 0
        frozen = self.source is not None and np.array_equal(x, self.source)
        if schedule == "dsq" and not key and not frozen:
            update = float(np.linalg.norm(x - self.base) / max(np.linalg.norm(x), 1e-30))
            budget = min(max(0.5 * update, 0.1 * budget), budget)
        candidates = []
        for as_key in (True,) if key else (False, True):
            base = np.zeros_like(x) if as_key else self.base
            r = x - base
            if measure == "l2":
                rh, bits = quantize(r, budget ** 2 * float((x * x).sum()))
            elif measure == "scaled":  # the decoder knows sqrt(weight)
                s = np.sqrt(weight)
                sh, bits = quantize(r * s, budget ** 2 * float((weight * x * x).sum()))
                rh = sh / s
            else:  # "prune": encoder-only weighting of which elements to prune
                target = budget ** 2 * float((weight * x * x).sum())
                best = None
                for share in (0.5, 0.8, 0.95):
                    mask = prune_by_importance(weight * r * r, share * target)
                    cand = quantize(r, target, weight, prune=mask)
                    if best is None or cand[1] < best[1]:
                        best = cand
                rh, bits = best
            candidates.append((bits + TENSOR_OVERHEAD_BITS, base + rh))
        bits, xh = min(candidates, key=lambda c: c[0])
        self.base, self.source, self.count = xh, x.copy(), self.count + 1
        return xh, bits

    def encode_log(self, v, max_rel):
        ratio = math.log(1 + 1.9 * max_rel)
        q = np.zeros(v.shape, np.int64)
        pos = v > 0
        q[pos] = np.round(np.log(v[pos]) / ratio).astype(np.int64)
        vh = np.where(pos, np.exp(q * ratio), 0.0)
        key = self.base is None or self.count % self.keyframe == 0
        bits = entropy_bits(q if key else q - self.base) + TENSOR_OVERHEAD_BITS
        self.base, self.count = q, self.count + 1
        return vh, bits


def make_workload(name, seed, steps):
    if name == "digits":
        import digits
        return digits.Digits("full", seed, steps)
    import charlm
    return charlm.CharLM("full", seed, steps)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", choices=["digits", "charlm"], required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--budget", type=float, default=1e-2)
    ap.add_argument("--schedule", choices=["off", "dsq"], default="dsq")
    ap.add_argument("--weights", choices=["l2", "fisher"], default="l2")
    ap.add_argument("--momentum-budget", type=float, default=0.2)
    ap.add_argument("--momentum", choices=["l2", "step", "step-prune", "zero"], default="l2")
    ap.add_argument("--second-moment-budget", type=float, default=0.2)
    ap.add_argument("--keyframe", type=int, default=10)
    ap.add_argument("--uninterrupted", action="store_true", help="the reference: no codec, no restores")
    a = ap.parse_args()
    import common
    import torch
    common.set_threads()
    sched = h.schedule(a.workload, "full")
    wl = make_workload(a.workload, a.seed, sched["steps"])
    model, opt = wl.model, wl.optimizer
    chains = {}
    bits = dict(weights=0.0, exp_avg=0.0, exp_avg_sq=0.0)
    raw = dict(weights=0, exp_avg=0, exp_avg_sq=0)

    def chain(key):
        return chains.setdefault(key, Chain(a.keyframe))

    model.train()
    for step in range(1, sched["steps"] + 1):
        common.train_step(wl, step)
        if a.uninterrupted or step % sched["save_every"]:
            continue
        params = {n: p for n, p in model.named_parameters() if opt.state.get(p)}
        v_hat, m_hat, w_hat = {}, {}, {}
        for n, p in params.items():
            v = opt.state[p]["exp_avg_sq"].double().numpy().ravel()
            v_hat[n], b = chain(n + ".v").encode_log(v, a.second_moment_budget)
            bits["exp_avg_sq"] += b
            raw["exp_avg_sq"] += 32 * v.size
        for n, t in model.state_dict().items():
            x = t.double().numpy().ravel()
            fisher = a.weights == "fisher" and n in v_hat
            weight = v_hat[n] + 1e-12 * (float(v_hat[n].mean()) + 1e-30) if fisher else None
            xh, b = chain(n).encode_l2(x, a.budget, "scaled" if fisher else "l2", weight, a.schedule)
            w_hat[n] = torch.from_numpy(xh.reshape(t.shape)).float()
            bits["weights"] += b
            raw["weights"] += 32 * x.size
        for n, p in params.items():
            m = opt.state[p]["exp_avg"].double().numpy().ravel()
            step_weight = 1.0 / (np.sqrt(v_hat[n]) + EPS) ** 2
            if a.momentum == "zero":
                m_hat[n], b = np.zeros_like(m), 0.0
            else:
                measure = {"l2": "l2", "step": "scaled", "step-prune": "prune"}[a.momentum]
                m_hat[n], b = chain(n + ".m").encode_l2(m, a.momentum_budget, measure, step_weight)
            bits["exp_avg"] += b
            raw["exp_avg"] += 32 * m.size
        if step % sched["restore_every"] == 0 and step < sched["steps"]:
            model.load_state_dict(w_hat)
            for n, p in params.items():
                opt.state[p]["exp_avg"].copy_(torch.from_numpy(m_hat[n].reshape(p.shape)))
                opt.state[p]["exp_avg_sq"].copy_(torch.from_numpy(v_hat[n].reshape(p.shape)))
    result = {
        "workload": a.workload, "seed": a.seed,
        "variant": {k: v for k, v in vars(a).items() if k not in ("workload", "seed")},
        "args": " ".join(arg for arg in sys.argv[1:] if arg not in ("--workload", a.workload)),
        "final": wl.evaluate(),
        # None: nothing stored (uninterrupted, or --momentum zero for exp_avg).
        "ratio": sum(raw.values()) / sum(bits.values()) if sum(bits.values()) else None,
        "ratio_parts": {k: raw[k] / bits[k] if bits[k] else None for k in bits},
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
