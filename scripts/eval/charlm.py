"""Character-level transformer language model on the fortune cookie texts
that Debian's `fortunes` package ships (/usr/share/games/fortunes), trained
with AdamW and a warmup + cosine learning-rate schedule. Besides the torch.save
checkpoint it writes the weights as safetensors next to it (model_NNNNNN.safetensors)."""
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

from common import save_safetensors

CORPUS_DIR = os.environ.get("CKPTFS_EVAL_CORPUS", "/usr/share/games/fortunes")

# d_model, layers, heads, context, batch per size; "full" has 1.02 M parameters.
SIZES = {
    "full": dict(d=128, layers=5, heads=4, ctx=32, batch=8),
    "smoke": dict(d=32, layers=1, heads=2, ctx=32, batch=8),
}


def load_corpus():
    """The corpus text (files in name order, the .dat indexes and .u8 links
    left out) split 95/5 into train/validation index tensors, and the vocab."""
    if not os.path.isdir(CORPUS_DIR):
        raise SystemExit(f"text corpus not found at {CORPUS_DIR}: apt-get install fortunes")
    parts = []
    for name in sorted(os.listdir(CORPUS_DIR)):
        path = os.path.join(CORPUS_DIR, name)
        if name.endswith((".dat", ".u8")) or os.path.islink(path) or not os.path.isfile(path):
            continue
        with open(path, "rb") as f:
            parts.append(f.read().decode("utf-8", errors="replace"))
    text = "\n".join(parts)
    vocab = sorted(set(text))
    index = {c: i for i, c in enumerate(vocab)}
    ids = torch.tensor([index[c] for c in text], dtype=torch.long)
    split = int(0.95 * len(ids))
    return ids[:split], ids[split:], vocab


class CharTransformer(nn.Module):
    def __init__(self, vocab, d, layers, heads, ctx):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(ctx, d)
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.1, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)
        self.register_buffer("mask", torch.triu(torch.full((ctx, ctx), float("-inf")), diagonal=1),
                             persistent=False)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t))
        x = self.blocks(x, mask=self.mask[:t, :t])
        return self.head(self.norm(x))


def warmup_cosine(total_steps, warmup_frac=0.1, floor=0.1):
    warmup = max(1, int(warmup_frac * total_steps))

    def factor(step):
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))
    return factor


def validation_windows(val_ids, ctx, size):
    """A fixed validation set: (inputs, targets) of evenly spaced windows of
    the held-out text."""
    n_val = 128 if size == "full" else 8
    starts = torch.linspace(0, len(val_ids) - ctx - 2, n_val).long()
    return (torch.stack([val_ids[s:s + ctx] for s in starts]),
            torch.stack([val_ids[s + 1:s + 1 + ctx] for s in starts]))


class CharLM:
    def __init__(self, size, seed, steps, init=None):
        cfg = SIZES[size]
        torch.manual_seed(seed)
        self.seed, self.ctx, self.batch = seed, cfg["ctx"], cfg["batch"]
        self.train_ids, self.val_ids, vocab = load_corpus()
        self.model = CharTransformer(len(vocab), cfg["d"], cfg["layers"], cfg["heads"], cfg["ctx"])
        decay = [p for n, p in self.model.named_parameters() if p.dim() >= 2]
        no_decay = [p for n, p in self.model.named_parameters() if p.dim() < 2]
        self.optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                            {"params": no_decay, "weight_decay": 0.0}],
                                           lr=2e-3, betas=(0.9, 0.98))
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, warmup_cosine(steps))
        self.val_x, self.val_y = validation_windows(self.val_ids, self.ctx, size)

    def loss(self, step):
        # Window offsets are a function of (seed, step) alone.
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        starts = torch.randint(0, len(self.train_ids) - self.ctx - 1, (self.batch,), generator=gen)
        x = torch.stack([self.train_ids[s:s + self.ctx] for s in starts])
        y = torch.stack([self.train_ids[s + 1:s + 1 + self.ctx] for s in starts])
        logits = self.model(x)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))

    def evaluate(self):
        self.model.eval()
        with torch.no_grad():
            logits = self.model(self.val_x)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), self.val_y.reshape(-1)).item()
            acc = (logits.argmax(-1) == self.val_y).float().mean().item()
        return {"loss": loss, "accuracy": acc}

    def extra_save(self, step, out_dir):
        save_safetensors(self.model.state_dict(), os.path.join(out_dir, f"model_{step:06d}.safetensors"))
