"""Makes the codec benchmark suite: checkpoints that look like real training,
each as a sequence of versions saved by torch.save while the model trains.
Nothing is downloaded: the data is made here or ships with Debian (sklearn's
digits, the Python standard library's source as text).

  make_suite.py OUT_DIR [--only NAME[,NAME...]] [--size full|smoke]

Writes OUT_DIR/<workload>/v<k>.pt (v0 the oldest) and OUT_DIR/<workload>/
INFO.json (what the workload is, the steps at which each version was saved).
A workload whose INFO.json exists is kept. Workloads (full size):

  mlp-init    four Linear(2048, 2048) with AdamW, a few steps from
              initialization, versions one step apart (about 200 MB each)
  mlp-deep    sixteen Linear(1024, 1024) with Adam on batches of 4, from
              the first step: the deep layers barely train (vanishing
              gradients), their moments are nearly constant planes;
              versions one step apart (about 200 MB each)
  lm          a byte-level transformer language model (4 layers, d=256)
              trained on Python source, AdamW, versions 20 steps apart
  lm-far      the same run, versions 150 steps apart
  conv        a conv net with batch norm on digits, SGD with momentum,
              versions 10 steps apart
  mixed       mixed precision as Megatron and DeepSpeed save it: bf16 model
              weights, fp32 master weights and fp32 Adam state (a
              transformer, d=384), versions 10 steps apart
  big         six Linear(4096, 4096) with Adam, over 1 GB per version,
              versions one step apart
"""
import argparse
import glob
import json
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

WORKLOADS = ["mlp-init", "mlp-deep", "lm", "lm-far", "conv", "mixed", "big"]


def save(path, obj):
    tmp = path + ".tmp"
    torch.save(obj, tmp)
    os.replace(tmp, path)


def full_state(model, opt, step, extra=None):
    state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}
    if extra:
        state.update(extra)
    return state


def write_info(out, info):
    with open(os.path.join(out, "INFO.json"), "w") as f:
        json.dump(info, f, indent=1)


# --- the workloads ---------------------------------------------------------

def mlp_run(out, width, layers, versions, opt_name, start_steps, description, batch=32):
    """A wide MLP near initialization: random inputs, one step apart."""
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])
    opt = (torch.optim.AdamW if opt_name == "adamw" else torch.optim.Adam)(model.parameters(), lr=1e-3)
    steps = []
    for step in range(start_steps + versions):
        x = torch.randn(batch, width)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step >= start_steps:
            save(os.path.join(out, f"v{len(steps)}.pt"), full_state(model, opt, step + 1))
            steps.append(step + 1)
    write_info(out, {"description": description, "steps": steps})


def text_corpus(limit_bytes):
    """Bytes of the Python standard library's source (Debian ships it)."""
    roots = sorted(glob.glob("/usr/lib/python3*/"))
    data = bytearray()
    for root in roots:
        for path in sorted(glob.glob(os.path.join(root, "*.py"))):
            with open(path, "rb") as f:
                data += f.read()
            if len(data) >= limit_bytes:
                return torch.tensor(list(data[:limit_bytes]), dtype=torch.long)
    if len(data) < 1 << 16:
        sys.exit("make_suite: no Python source found for the language model's corpus")
    return torch.tensor(list(data), dtype=torch.long)


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x, mask):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class ByteLM(nn.Module):
    def __init__(self, d, layers, heads, ctx):
        super().__init__()
        self.embed = nn.Embedding(256, d)
        self.pos = nn.Parameter(torch.zeros(ctx, d))
        self.blocks = nn.ModuleList([Block(d, heads) for _ in range(layers)])
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, 256, bias=False)
        self.register_buffer("mask", torch.triu(torch.full((ctx, ctx), float("-inf")), 1), persistent=False)

    def forward(self, tokens):
        t = tokens.shape[1]
        x = self.embed(tokens) + self.pos[:t]
        for b in self.blocks:
            x = b(x, self.mask[:t, :t])
        return self.head(self.ln(x))


def lm_batches(corpus, ctx, batch, step):
    gen = torch.Generator().manual_seed(step)
    idx = torch.randint(0, len(corpus) - ctx - 1, (batch,), generator=gen)
    seq = torch.stack([corpus[i:i + ctx + 1] for i in idx.tolist()])
    return seq[:, :-1], seq[:, 1:]


def lm_runs(out_near, out_far, size):
    """One LM run; the near sequence 20 steps apart, the far one 150 apart."""
    torch.manual_seed(0)
    d, layers, ctx, batch = (256, 4, 64, 16) if size == "full" else (64, 2, 32, 8)
    corpus = text_corpus(4 << 20)
    model = ByteLM(d, layers, 4, ctx)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    near = [200, 220, 240, 260] if size == "full" else [20, 22, 24]
    far = [150, 300, 450, 600] if size == "full" else [10, 20, 30]
    saved_near, saved_far = [], []
    for step in range(1, max(near + far) + 1):
        x, y = lm_batches(corpus, ctx, batch, step)
        loss = F.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        extra = {"loss": float(loss)}
        if out_near and step in near:
            save(os.path.join(out_near, f"v{len(saved_near)}.pt"), full_state(model, opt, step, extra))
            saved_near.append(step)
        if out_far and step in far:
            save(os.path.join(out_far, f"v{len(saved_far)}.pt"), full_state(model, opt, step, extra))
            saved_far.append(step)
    if out_near:
        write_info(out_near, {"description": f"byte-level transformer LM (d={d}, {layers} layers) trained on "
                              "Python source with AdamW, versions 20 steps apart", "steps": saved_near})
    if out_far:
        write_info(out_far, {"description": f"the same LM run, versions 150 steps apart", "steps": saved_far})


def digits_images():
    from sklearn.datasets import load_digits
    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    # 8x8 digits upsampled to 16x16, so that the net has a spatial pyramid.
    x = F.interpolate(x, size=16, mode="bilinear", align_corners=False)
    return x, torch.tensor(digits.target, dtype=torch.long)


def conv_run(out, size):
    torch.manual_seed(0)
    x, y = digits_images()
    c = (128, 256, 384) if size == "full" else (16, 32, 48)

    def stage(cin, cout):
        return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
                             nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())

    model = nn.Sequential(stage(1, c[0]), nn.MaxPool2d(2), stage(c[0], c[1]), nn.MaxPool2d(2), stage(c[1], c[2]),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c[2], 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4, nesterov=True)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=1000)
    saves = [60, 70, 80, 90] if size == "full" else [6, 7, 8]
    steps = []
    for step in range(1, saves[-1] + 1):
        gen = torch.Generator().manual_seed(step)
        idx = torch.randint(0, len(y), (32,), generator=gen)
        loss = F.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if step in saves:
            save(os.path.join(out, f"v{len(steps)}.pt"),
                 full_state(model, opt, step, {"lr_scheduler": sched.state_dict()}))
            steps.append(step)
    write_info(out, {"description": "conv net with batch norm on digits, SGD with Nesterov momentum and a cosine "
                     "schedule, versions 10 steps apart", "steps": steps})


def mixed_run(out, size):
    """bf16 model weights, fp32 master weights and fp32 Adam moments."""
    torch.manual_seed(0)
    d, layers, ctx, batch = (384, 4, 64, 8) if size == "full" else (64, 2, 32, 8)
    corpus = text_corpus(4 << 20)
    master = ByteLM(d, layers, 4, ctx)
    opt = torch.optim.Adam(master.parameters(), lr=3e-4)
    saves = [40, 50, 60] if size == "full" else [4, 5, 6]
    steps = []
    names = [n for n, _ in master.named_parameters()]
    for step in range(1, saves[-1] + 1):
        x, y = lm_batches(corpus, ctx, batch, step)
        # The forward pass in bf16 weights, as mixed precision runs it: the
        # master copy is rounded, the gradient lands on the fp32 master.
        with torch.no_grad():
            rounded = {n: p.to(torch.bfloat16).to(torch.float32) for n, p in master.named_parameters()}
            backup = {n: p.detach().clone() for n, p in master.named_parameters()}
            for n, p in master.named_parameters():
                p.copy_(rounded[n])
        loss = F.cross_entropy(master(x).reshape(-1, 256), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        with torch.no_grad():
            for n, p in master.named_parameters():
                p.copy_(backup[n])
        opt.step()
        if step in saves:
            o = opt.state_dict()
            state = {
                "module": {k: (v.to(torch.bfloat16) if v.is_floating_point() else v)
                           for k, v in master.state_dict().items()},
                "optimizer": {
                    "fp32_master_weights": {n: p.detach().clone() for n, p in master.named_parameters()},
                    "state": {names[i]: s for i, s in o["state"].items()},
                    "param_groups": o["param_groups"],
                },
                "iteration": step,
            }
            save(os.path.join(out, f"v{len(steps)}.pt"), state)
            steps.append(step)
    write_info(out, {"description": f"mixed precision (transformer d={d}): bf16 model weights, fp32 master "
                     "weights and fp32 Adam state, versions 10 steps apart", "steps": steps})


def build(name, out, size):
    os.makedirs(out, exist_ok=True)
    if name == "mlp-init":
        w = 2048 if size == "full" else 256
        mlp_run(out, w, 4, 3, "adamw", 4,
                f"four Linear({w}, {w}) with AdamW, 5 steps from initialization, versions one step apart")
    elif name == "mlp-deep":
        w = 1024 if size == "full" else 128
        mlp_run(out, w, 16, 3, "adam", 0,
                f"sixteen Linear({w}, {w}) with Adam on batches of 4 (vanishing gradients: nearly constant "
                "moments in the deep layers), versions one step apart from the first", batch=4)
    elif name == "big":
        w = 4096 if size == "full" else 384
        mlp_run(out, w, 6, 2, "adam", 1,
                f"six Linear({w}, {w}) with Adam, a step from initialization, versions one step apart")
    elif name == "conv":
        conv_run(out, size)
    elif name == "mixed":
        mixed_run(out, size)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--only", default=",".join(WORKLOADS))
    ap.add_argument("--size", choices=["full", "smoke"], default="full")
    args = ap.parse_args()
    torch.set_num_threads(2)
    wanted = [w for w in args.only.split(",") if w]
    for w in wanted:
        if w not in WORKLOADS:
            sys.exit(f"make_suite: unknown workload {w!r}; known: {', '.join(WORKLOADS)}")
    todo = [w for w in wanted if not os.path.exists(os.path.join(args.out, w, "INFO.json"))]
    lm_near = os.path.join(args.out, "lm") if "lm" in todo else None
    lm_far = os.path.join(args.out, "lm-far") if "lm-far" in todo else None
    for d in (lm_near, lm_far):
        if d:
            os.makedirs(d, exist_ok=True)
    if lm_near or lm_far:
        print("make_suite: lm", file=sys.stderr, flush=True)
        lm_runs(lm_near, lm_far, args.size)
    for w in todo:
        if w in ("lm", "lm-far"):
            continue
        print(f"make_suite: {w}", file=sys.stderr, flush=True)
        build(w, os.path.join(args.out, w), args.size)


if __name__ == "__main__":
    main()
