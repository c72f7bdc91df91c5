"""A transformer fine-tune in mixed precision: the character LM
(charlm.CharTransformer) pretrained in fp32 on the general fortune texts,
then fine-tuned on the technical ones (computers, linux, perl, debian) with
bf16 weights, fp32 master weights and fp32 AdamW state, the way mixed
precision trainers keep them. A checkpoint holds the bf16 model and the
optimizer's state dict with the fp32 masters beside the moments, as
DeepSpeed's bf16 optimizer saves them. Nothing in the codec or its
defaults was tuned on it.

The weights are bf16 values (the masters rounded after every step) but the
forward pass runs in fp32 on them: CPUs without bf16 matrix units emulate
bf16 matmuls several times slower, and the checkpoints, which are what the
evaluation measures, are the same either way."""
import os

import torch

import charlm

# Fine-tuning corpus: the technical files; pretraining: all the others.
TECH = ("computers", "linux", "linuxcookie", "perl", "debian")


def load_domain(tech):
    """(train ids, validation ids, vocab) of the technical files (tech=True)
    or of the others, with the vocabulary of the whole corpus so that the
    pretrained model's embedding fits the fine-tune."""
    if not os.path.isdir(charlm.CORPUS_DIR):
        raise SystemExit(f"text corpus not found at {charlm.CORPUS_DIR}: apt-get install fortunes")
    texts = {}
    for name in sorted(os.listdir(charlm.CORPUS_DIR)):
        path = os.path.join(charlm.CORPUS_DIR, name)
        if name.endswith((".dat", ".u8")) or os.path.islink(path) or not os.path.isfile(path):
            continue
        with open(path, "rb") as f:
            texts[name] = f.read().decode("utf-8", errors="replace")
    vocab = sorted(set("".join(texts.values())))
    index = {c: i for i, c in enumerate(vocab)}
    text = "\n".join(t for n, t in texts.items() if (n in TECH) == tech)
    ids = torch.tensor([index[c] for c in text], dtype=torch.long)
    split = int(0.95 * len(ids))
    return ids[:split], ids[split:], vocab


class MasterWeightAdamW:
    """AdamW on fp32 master copies of a bf16 model's parameters: gradients
    are copied up to the masters, the step runs in fp32, the masters are
    rounded back into the model. state_dict() is AdamW's with the masters
    under "fp32_master" (a list in parameter order)."""

    def __init__(self, model, lr, betas, weight_decay):
        self.params = list(model.parameters())
        with torch.no_grad():
            for p in self.params:
                p.copy_(p.to(torch.bfloat16))
        self.master = [torch.nn.Parameter(p.detach().float().clone()) for p in self.params]
        decay = [m for p, m in zip(self.params, self.master) if p.dim() >= 2]
        no_decay = [m for p, m in zip(self.params, self.master) if p.dim() < 2]
        self.inner = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                                        {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=betas)

    def zero_grad(self, set_to_none=True):
        for p in self.params:
            p.grad = None

    def step(self):
        for p, m in zip(self.params, self.master):
            m.grad = None if p.grad is None else p.grad.float()
        self.inner.step()
        with torch.no_grad():
            for p, m in zip(self.params, self.master):
                p.copy_(m.to(torch.bfloat16))

    def state_dict(self):
        state = self.inner.state_dict()
        state["fp32_master"] = [m.detach().clone() for m in self.master]
        return state

    def load_state_dict(self, state):
        state = dict(state)
        masters = state.pop("fp32_master")
        with torch.no_grad():
            for p, m, saved in zip(self.params, self.master, masters):
                m.copy_(saved)
                p.copy_(m.to(torch.bfloat16))
        self.inner.load_state_dict(state)


def _to_bf16(module, state, prefix, local_metadata):
    for k, v in state.items():
        if v.is_floating_point():
            state[k] = v.to(torch.bfloat16)
    return state


class _LM(charlm.CharLM):
    """charlm.CharLM's batches and evaluation on one domain of the corpus
    (its __init__ is replaced by _setup), without its safetensors copy."""

    def _setup(self, size, seed, tech):
        cfg = charlm.SIZES[size]
        self.seed, self.ctx, self.batch = seed, cfg["ctx"], cfg["batch"]
        self.train_ids, self.val_ids, vocab = load_domain(tech)
        self.val_x, self.val_y = charlm.validation_windows(self.val_ids, self.ctx, size)
        return cfg, vocab

    def extra_save(self, step, out_dir):
        pass


class CharLMPretrain(_LM):
    """The pretraining half: the general texts, fp32, charlm's optimizer."""

    def __init__(self, size, seed, steps, init=None):
        torch.manual_seed(seed)
        cfg, vocab = self._setup(size, seed, tech=False)
        self.model = charlm.CharTransformer(len(vocab), cfg["d"], cfg["layers"], cfg["heads"], cfg["ctx"])
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=2e-3, betas=(0.9, 0.98), weight_decay=0.1)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, charlm.warmup_cosine(steps))


class CharLMFinetuneBf16(_LM):
    """The fine-tune: the pretrained model in `init`, cast to bf16, trained
    on the technical texts with MasterWeightAdamW (lr 5e-4, warmup +
    cosine)."""

    def __init__(self, size, seed, steps, init=None):
        if init is None:
            raise SystemExit("charlm-finetune-bf16 needs --init PRETRAINED_CHECKPOINT")
        torch.manual_seed(seed)
        cfg, vocab = self._setup(size, seed, tech=True)
        self.model = charlm.CharTransformer(len(vocab), cfg["d"], cfg["layers"], cfg["heads"], cfg["ctx"])
        self.model.load_state_dict(torch.load(init)["model"])
        # The model's state dict (what torch.save writes) is bf16.
        self.model._register_state_dict_hook(_to_bf16)
        self.optimizer = MasterWeightAdamW(self.model, lr=5e-4, betas=(0.9, 0.98), weight_decay=0.1)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer.inner, charlm.warmup_cosine(steps))
