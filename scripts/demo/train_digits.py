"""Trains a small CNN on scikit-learn's digits data set and saves regular
checkpoints (model, Adam state, step, RNG state) with plain torch.save into a
directory: the unchanged training loop ckptfs is meant to sit under.

  train_digits.py --out DIR [--steps 300] [--save-every 50] [--width 32]
                  [--resume FILE] [--bf16]

Prints one JSON line per checkpoint ({"step", "path", "loss", "accuracy"}).
"""
import argparse
import json
import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from sklearn.datasets import load_digits


class DigitsNet(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.conv1 = nn.Conv2d(1, width, 3, padding=1)
        self.conv2 = nn.Conv2d(width, 2 * width, 3, padding=1)
        self.fc1 = nn.Linear(2 * width * 4 * 4, 8 * width)
        self.fc2 = nn.Linear(8 * width, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)   # 8x8 -> 4x4
        x = F.relu(self.conv2(x))
        x = x.flatten(1)
        return self.fc2(F.relu(self.fc1(x)))


def load_data():
    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    gen = torch.Generator().manual_seed(0)
    perm = torch.randperm(len(y), generator=gen)
    x, y = x[perm], y[perm]
    split = int(0.8 * len(y))
    return (x[:split], y[:split]), (x[split:], y[split:])


def batch_for_step(train, step, batch_size=64):
    # The data order is a function of the step alone, so a resumed run sees
    # exactly the batches an uninterrupted one would.
    x, y = train
    gen = torch.Generator().manual_seed(1000 + step)
    idx = torch.randint(0, len(y), (batch_size,), generator=gen)
    return x[idx], y[idx]


def evaluate(model, test):
    model.eval()
    with torch.no_grad():
        x, y = test
        logits = model(x)
        loss = F.cross_entropy(logits, y).item()
        acc = (logits.argmax(1) == y).float().mean().item()
    model.train()
    return loss, acc


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--save-every", type=int, default=50)
    ap.add_argument("--width", type=int, default=32)
    ap.add_argument("--resume", default=None)
    ap.add_argument("--bf16", action="store_true", help="save weights and state in bfloat16")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    torch.set_num_threads(2)
    torch.manual_seed(args.seed)
    train, test = load_data()
    model = DigitsNet(args.width)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    start = 0
    if args.resume:
        ckpt = torch.load(args.resume)
        model.load_state_dict({k: v.float() for k, v in ckpt["model"].items()})
        opt.load_state_dict(ckpt["optimizer"])
        torch.set_rng_state(ckpt["rng_state"])
        start = ckpt["step"]

    os.makedirs(args.out, exist_ok=True)
    for step in range(start + 1, args.steps + 1):
        xb, yb = batch_for_step(train, step)
        loss = F.cross_entropy(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % args.save_every == 0 or step == args.steps:
            state = {
                "model": model.state_dict(),
                "optimizer": opt.state_dict(),
                "step": step,
                "rng_state": torch.get_rng_state(),
            }
            if args.bf16:
                state["model"] = {k: v.to(torch.bfloat16) for k, v in state["model"].items()}
            path = os.path.join(args.out, f"ckpt_{step:06d}.pt")
            torch.save(state, path)
            test_loss, acc = evaluate(model, test)
            print(json.dumps({"step": step, "path": path, "loss": round(test_loss, 5),
                              "accuracy": round(acc, 5)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
