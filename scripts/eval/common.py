"""Pieces every eval workload shares: checkpoint writing (torch.save and a
hand-written safetensors writer), the RNG state that makes a resumed run
identical to an uninterrupted one, and the training driver.

The driver is the "unchanged training loop": it only saves into the
directory it is given, so the harness chooses the storage backend by
choosing that directory.
"""
import json
import os
import struct
import time

import torch


def set_threads():
    """One intra-op thread unless CKPTFS_EVAL_THREADS says otherwise. On a
    busy 2-core machine two OpenMP threads spin against other processes (the
    char LM ran 6x slower with 2 threads than with 1 there). The count must
    be the same for a run and its resumed segments: it fixes the reduction
    order of the CPU kernels, hence bit-identical results."""
    torch.set_num_threads(int(os.environ.get("CKPTFS_EVAL_THREADS", "1")))


_ST_DTYPES = {
    torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.float64: "F64", torch.int64: "I64", torch.int32: "I32",
    torch.uint8: "U8", torch.bool: "BOOL",
}


def safetensors_bytes(tensors, metadata=None):
    """The bytes of a safetensors file holding {name: tensor}: u64 LE header
    length, a JSON header padded with spaces to a multiple of 8, then the raw
    data (little endian, C order) in key order. `metadata` ({str: str})
    becomes the header's "__metadata__" entry."""
    header, blobs, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = dict(metadata)
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu()
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": _ST_DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return b"".join([struct.pack("<Q", len(text)), text] + blobs)


def save_safetensors(tensors, path):
    """Writes {name: tensor} as safetensors (safetensors_bytes) to a sibling
    temp file, then renames it over `path`. Written by hand: no safetensors
    package here."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(safetensors_bytes(tensors))
    os.replace(tmp, path)


def load_safetensors(path):
    """Reads a file written by save_safetensors (for tests and checks)."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    inv = {v: k for k, v in _ST_DTYPES.items()}
    out = {}
    for name, h in header.items():
        if name == "__metadata__":
            continue
        a, b = h["data_offsets"]
        buf = bytearray(data[base + a:base + b])
        t = torch.frombuffer(buf, dtype=torch.uint8) if buf else torch.empty(0, dtype=torch.uint8)
        out[name] = t.view(inv[h["dtype"]]).reshape(h["shape"])
    return out


def ckpt_name(step):
    return f"ckpt_{step:06d}.pt"


def train_step(workload, step):
    """One optimizer step on the batch of `step` (and the scheduler's step);
    returns the loss."""
    loss = workload.loss(step)
    workload.optimizer.zero_grad(set_to_none=True)
    loss.backward()
    workload.optimizer.step()
    if workload.scheduler is not None:
        workload.scheduler.step()
    return loss


def train(workload, args):
    """Runs `workload` from its start (or args.resume) up to args.stop_at
    (default args.steps), saving {model, optimizer, scheduler, step,
    rng_state} every args.save_every steps into args.out with torch.save.

    The workload object provides: model, optimizer, scheduler (or None),
    loss(step) -> scalar tensor for the batch of `step` (a function of the
    step alone), evaluate() -> dict, extra_save(step, out_dir) (optional).
    Prints one JSON line per step ({"step", "train_loss"}) and per checkpoint
    ({"step", "eval": {...}}). Writes args.final (the last state) if given.
    """
    model, opt, sched = workload.model, workload.optimizer, workload.scheduler
    start = 0
    if args.resume:
        ckpt = torch.load(args.resume)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        if sched is not None:
            sched.load_state_dict(ckpt["scheduler"])
        torch.set_rng_state(ckpt["rng_state"])
        start = ckpt["step"]
    eval_only = getattr(args, "eval_only", False)
    if eval_only and not args.resume:
        raise SystemExit("--eval-only needs --resume")
    stop = args.stop_at or args.steps
    os.makedirs(args.out, exist_ok=True)
    log = open(args.log, "a") if args.log else None

    def emit(rec):
        line = json.dumps(rec)
        if log:
            log.write(line + "\n")
            log.flush()
        else:
            print(line, flush=True)

    if eval_only:
        emit({"step": start, "eval": workload.evaluate()})
        if log:
            log.close()
        return
    t0 = time.time()
    model.train()
    for step in range(start + 1, stop + 1):
        loss = train_step(workload, step)
        emit({"step": step, "train_loss": loss.item()})
        if step % args.save_every == 0 or step == args.steps:
            state = {
                "model": model.state_dict(),
                "optimizer": opt.state_dict(),
                "scheduler": sched.state_dict() if sched is not None else None,
                "step": step,
                "rng_state": torch.get_rng_state(),
            }
            torch.save(state, os.path.join(args.out, ckpt_name(step)))
            if hasattr(workload, "extra_save"):
                workload.extra_save(step, args.out)
            # Evaluation must not consume the training RNG stream.
            rng = torch.get_rng_state()
            metrics = workload.evaluate()
            torch.set_rng_state(rng)
            model.train()
            emit({"step": step, "eval": metrics})
    if args.final:
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": stop,
                    "eval": workload.evaluate()}, args.final)
    emit({"done": stop, "seconds": round(time.time() - t0, 2)})
    if log:
        log.close()
