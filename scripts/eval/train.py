#!/usr/bin/python3
"""Trains one eval workload, saving checkpoints with plain torch.save into
--out. The harness runs it as a new process per restore-and-resume cycle.

  train.py WORKLOAD --out DIR --steps N --save-every K [--stop-at S]
           [--resume CKPT] [--init PRETRAINED] [--seed S] [--size full|smoke]
           [--final FILE] [--log FILE] [--eval-only]

WORKLOAD: digits | charlm | digits-pretrain | digits-finetune | resnet |
charlm-pretrain | charlm-finetune-bf16.
Logs JSON lines ({"step", "train_loss"} per step, {"step", "eval"} per
checkpoint) to --log or stdout.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402
import digits  # noqa: E402

WORKLOADS = {
    "digits": lambda: digits.Digits,
    "digits-pretrain": lambda: digits.DigitsPretrain,
    "digits-finetune": lambda: digits.DigitsFinetune,
    "charlm": lambda: __import__("charlm").CharLM,
    "resnet": lambda: __import__("resnet").ResNetDigits,
    "charlm-pretrain": lambda: __import__("finetune_bf16").CharLMPretrain,
    "charlm-finetune-bf16": lambda: __import__("finetune_bf16").CharLMFinetuneBf16,
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("workload", choices=sorted(WORKLOADS))
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--save-every", type=int, required=True)
    ap.add_argument("--stop-at", type=int, default=None, help="exit after this step (an interruption)")
    ap.add_argument("--resume", default=None)
    ap.add_argument("--init", default=None, help="pretrained checkpoint (the fine-tunes)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--size", choices=["full", "smoke"], default="full")
    ap.add_argument("--final", default=None)
    ap.add_argument("--log", default=None)
    ap.add_argument("--eval-only", action="store_true",
                    help="with --resume: evaluate the checkpoint's model and exit (no step, no save)")
    args = ap.parse_args()
    common.set_threads()
    workload = WORKLOADS[args.workload]()(args.size, args.seed, args.steps, init=args.init)
    common.train(workload, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
