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
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "eval"))
import digits  # noqa: E402  (scripts/eval/digits.py)


# The model and the data split are the evaluation's digits workload.
DigitsNet = digits.DigitsNet
load_data = digits.load_split


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
