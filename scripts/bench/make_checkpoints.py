"""Makes the checkpoints the benchmarks compress: a trained model with its
Adam state, saved with torch.save, in fp32 and in bf16, plus a sequence of
consecutive versions for delta benchmarks, and a longer sequence that
continues training with a decaying learning rate (converging training, for
the dynamic-precision budget schedule).

  make_checkpoints.py OUT_DIR [--hidden 1024] [--steps 200] [--versions 4]
                      [--decay-versions 8] [--decay 0.5]

Writes OUT_DIR/fp32.pt (model + Adam, fp32), OUT_DIR/bf16.pt (model and
Adam state cast to bf16), OUT_DIR/bf16-model.pt (bf16 weights only, as a
released bf16 model is saved), OUT_DIR/seq/v{k}.pt and
OUT_DIR/seq-decay/v{k}.pt (the learning rate times --decay every version).
"""
import argparse
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from sklearn.datasets import load_digits


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--versions", type=int, default=4)
    ap.add_argument("--steps-between", type=int, default=10)
    ap.add_argument("--decay-versions", type=int, default=8)
    ap.add_argument("--decay", type=float, default=0.5)
    args = ap.parse_args()
    torch.set_num_threads(2)
    torch.manual_seed(0)

    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    h = args.hidden
    model = nn.Sequential(nn.Linear(64, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(),
                          nn.Linear(h, h), nn.ReLU(), nn.Linear(h, 10))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def train(steps, start):
        for step in range(start, start + steps):
            gen = torch.Generator().manual_seed(step)
            idx = torch.randint(0, len(y), (128,), generator=gen)
            loss = F.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
        return start + steps

    def state(step, dtype=None):
        m = model.state_dict()
        o = opt.state_dict()
        if dtype is not None:
            m = {k: v.to(dtype) for k, v in m.items()}
            o = {"state": {k: {n: (t.to(dtype) if t.is_floating_point() and t.dim() > 0 else t)
                               for n, t in s.items()} for k, s in o["state"].items()},
                 "param_groups": o["param_groups"]}
        return {"model": m, "optimizer": o, "step": step}

    os.makedirs(os.path.join(args.out, "seq"), exist_ok=True)
    os.makedirs(os.path.join(args.out, "seq-decay"), exist_ok=True)
    step = train(args.steps, 0)
    torch.save(state(step), os.path.join(args.out, "fp32.pt"))
    torch.save(state(step, torch.bfloat16), os.path.join(args.out, "bf16.pt"))
    torch.save(state(step, torch.bfloat16)["model"], os.path.join(args.out, "bf16-model.pt"))
    for v in range(args.versions):
        torch.save(state(step), os.path.join(args.out, "seq", f"v{v}.pt"))
        step = train(args.steps_between, step)
    # Converging training: the same run continues, the learning rate decays
    # by --decay before each interval, so the updates between versions shrink.
    for v in range(args.decay_versions):
        torch.save(state(step), os.path.join(args.out, "seq-decay", f"v{v}.pt"))
        for group in opt.param_groups:
            group["lr"] *= args.decay
        step = train(args.steps_between, step)


if __name__ == "__main__":
    main()
