#!/usr/bin/python3
"""Experiment: transfer learning from a checkpoint restored from the mount.

  exp_transfer.py [--size full|smoke] [--backends ...] [--workdir DIR] [--results DIR]

A DigitsNet is pretrained on digits 0-4 (plain directory, seed 0). Fine-tuning
on digits 5-9 re-initialises the head and freezes conv1/conv2, so their
tensors are identical in every fine-tuning checkpoint. The baseline
fine-tunes from the original pretrained file (seeds 0-2); for each backend
the pretrained file is written into the mount, read back after a remount,
and fine-tuning runs with its checkpoints in the mount and 10 restores (the
fault-tolerance protocol of exp_fault_tolerance.py). Also reports how the
pretrained checkpoint itself came back from the store.

Writes RESULTS/fault-transfer.{json,md,png}; the compression of the
fine-tuning sequence (frozen layers) is exp_compression.py --workload transfer.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import exp_fault_tolerance as ft  # noqa: E402
import harness as h  # noqa: E402


def main():
    args = ft.parser(__doc__).parse_args()
    args.workload = "transfer"
    original = h.pretrained_checkpoint(args.workdir, "transfer", args.size)

    def pretrained_report(backend, work):
        root = backend.start(work)
        try:
            identical, max_diff = h.compare_states(original, os.path.join(root, "pretrained.pt"))
            backend.stop()
        except BaseException:
            backend.teardown()
            raise
        s = backend.stats()["pretrained.pt"]
        return {"pretrained": {"bit_identical": identical, "max_abs_diff": max_diff,
                               "ratio": s["logical_bytes"] / s["stored_bytes"]}}

    res = ft.run(args, extra=pretrained_report)
    return 1 if res["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
