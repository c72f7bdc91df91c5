#!/usr/bin/python3
"""How far an error in a first moment moves the weights, against the update
between two checkpoints.

  momentum_reach.py CKPT_DIR        # the ckpt_*.pt files of one run, in order

After a restore, an error e in SGD's momentum buffer moves the weights by
about lr x momentum / (1 - momentum) x e over the steps that follow (the
buffer decays by `momentum` per step, and with Nesterov each step adds
momentum x buffer); an error in Adam's first moment, measured on its step
m_hat / (sqrt(v_hat) + eps), by lr x beta1 / (1 - beta1) x e. For each
checkpoint after the first this prints, over the parameters of at least
4096 elements, the median (and range) of

    reach = lr x f x ||step|| / ||w - w_previous||,   f = momentum / (1 - momentum) or beta1 / (1 - beta1)

so that a relative budget b on the step moves the weights by about
b x reach of their update between checkpoints. A parameter's state is
matched to its weights by shape and the best correlation of the step with
the update (optimizer state is indexed by position, not by name).
docs/policy.md uses it to compare SGD's momentum budget with Adam's.
"""
import os
import sys

import torch


def step_of(state, group):
    """(the step, f) of one parameter's optimizer state."""
    if "momentum_buffer" in state:
        mu = group["momentum"]
        return state["momentum_buffer"].float(), mu / (1 - mu)
    b1, b2 = group["betas"]
    t = state["step"].item() if torch.is_tensor(state["step"]) else state["step"]
    m = state["exp_avg"].float() / (1 - b1 ** t)
    v = state["exp_avg_sq"].float() / (1 - b2 ** t)
    return m / (v.sqrt() + group["eps"]), b1 / (1 - b1)


def reaches(ckpt, prev):
    opt = ckpt["optimizer"]
    model, prev_model = ckpt["model"], prev["model"]
    out = []
    for group in opt["param_groups"]:
        for i in group["params"]:
            state = opt["state"].get(i)
            if not state or ("momentum_buffer" not in state and "exp_avg" not in state):
                continue
            step, f = step_of(state, group)
            if step.numel() < 4096:
                continue
            best = None
            for name, w in model.items():
                if not torch.is_tensor(w) or w.shape != step.shape or not w.dtype.is_floating_point:
                    continue
                dw = (w.float() - prev_model[name].float()).flatten()
                norm = dw.norm().item()
                if norm == 0:
                    continue
                corr = abs(torch.dot(dw, step.flatten()).item()) / (norm * step.norm().item() + 1e-30)
                if best is None or corr > best[0]:
                    best = (corr, norm)
            if best:
                out.append(group["lr"] * f * step.norm().item() / best[1])
    return sorted(out)


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    d = sys.argv[1]
    files = sorted(f for f in os.listdir(d) if f.startswith("ckpt_") and f.endswith(".pt"))
    prev = None
    for name in files:
        ckpt = torch.load(os.path.join(d, name))
        if prev is not None:
            r = reaches(ckpt, prev)
            if r:
                print(f"{name}: reach median {r[len(r) // 2]:.3f}, {r[0]:.3f}-{r[-1]:.3f} over {len(r)} parameters")
        prev = ckpt
    return 0


if __name__ == "__main__":
    sys.exit(main())
