"""Workloads on scikit-learn's digits (8x8 images, 1797 samples): a small
CNN classifier trained with Adam, and the transfer-learning pair (pretrain
on digits 0-4, fine-tune on 5-9 with the conv layers frozen)."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from sklearn.datasets import load_digits

# width of the CNN per size; "full" has 0.28 M parameters.
WIDTH = {"full": 32, "smoke": 8}


class DigitsNet(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.conv1 = nn.Conv2d(1, width, 3, padding=1)
        self.conv2 = nn.Conv2d(width, 2 * width, 3, padding=1)
        self.fc1 = nn.Linear(2 * width * 4 * 4, 8 * width)
        self.fc2 = nn.Linear(8 * width, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)  # 8x8 -> 4x4
        x = F.relu(self.conv2(x))
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def load_split(classes=None):
    """(train, test) tensors, a fixed 80/20 split, optionally only `classes`."""
    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    x, y = x[perm], y[perm]
    if classes is not None:
        keep = torch.isin(y, torch.tensor(classes))
        x, y = x[keep], y[keep]
    split = int(0.8 * len(y))
    return (x[:split], y[:split]), (x[split:], y[split:])


def batch_for_step(data, seed, step, batch_size=64):
    # The data order is a function of (seed, step) alone, so a resumed run
    # sees exactly the batches an uninterrupted one would.
    x, y = data
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    idx = torch.randint(0, len(y), (batch_size,), generator=gen)
    return x[idx], y[idx]


class _Classifier:
    def loss(self, step):
        xb, yb = batch_for_step(self.train_data, self.seed, step)
        return F.cross_entropy(self.model(xb), yb)

    def evaluate(self):
        self.model.eval()
        with torch.no_grad():
            x, y = self.test_data
            logits = self.model(x)
            loss = F.cross_entropy(logits, y).item()
            acc = (logits.argmax(1) == y).float().mean().item()
        return {"loss": loss, "accuracy": acc}


class Digits(_Classifier):
    """All ten classes, Adam with a step decay."""

    def __init__(self, size, seed, steps, init=None):
        torch.manual_seed(seed)
        self.seed = seed
        self.train_data, self.test_data = load_split()
        self.model = DigitsNet(WIDTH[size])
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-3)
        self.scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=max(1, steps // 3), gamma=0.5)


class DigitsPretrain(Digits):
    """Pretraining half of the transfer pair: digits 0-4 only."""

    def __init__(self, size, seed, steps, init=None):
        super().__init__(size, seed, steps)
        self.train_data, self.test_data = load_split([0, 1, 2, 3, 4])


class DigitsFinetune(_Classifier):
    """Fine-tuning half: starts from the pretrained model in `init` (the
    checkpoint file, read from wherever the harness put it), re-initialises
    the head (from `seed`), freezes conv1/conv2 and trains on digits 5-9."""

    def __init__(self, size, seed, steps, init=None):
        if init is None:
            raise SystemExit("digits-finetune needs --init PRETRAINED_CHECKPOINT")
        self.seed = seed
        self.train_data, self.test_data = load_split([5, 6, 7, 8, 9])
        self.model = DigitsNet(WIDTH[size])
        self.model.load_state_dict(torch.load(init)["model"])
        torch.manual_seed(seed)
        self.model.fc2.reset_parameters()
        for layer in (self.model.conv1, self.model.conv2):
            for p in layer.parameters():
                p.requires_grad_(False)
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.Adam(trainable, lr=1e-3)
        self.scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=max(1, steps // 3), gamma=0.5)
