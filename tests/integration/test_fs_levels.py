"""The named levels (-o level=lossless|safe|default|compact|max): each keeps its
promise on the error, and more error buys more ratio."""
import io
import json
import os
import subprocess

import pytest

from conftest import CKPTFS

torch = pytest.importorskip("torch")


def versions(n=3):
    """n checkpoints of one small training run (an MLP + AdamW)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 128))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    out = []
    for _ in range(n):
        for _ in range(5):
            model(torch.randn(32, 128)).square().mean().backward()
            opt.step()
            opt.zero_grad()
        buf = io.BytesIO()
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, buf)
        # What was saved (state_dict() shares the live parameters).
        out.append((torch.load(io.BytesIO(buf.getvalue())), buf.getvalue()))
    return out


def weight_error(path, sd):
    got = torch.load(path)
    return max(float((got["model"][k] - v).norm() / v.norm()) for k, v in sd["model"].items())


def test_levels_keep_their_error_promise_and_order_the_ratio(store):
    runs = versions()
    ratio = {}
    for level, max_err in (("lossless", 0.0), ("safe", 0.003), ("default", 0.01), ("compact", 0.02),
                           ("max", 0.03)):
        # A store per level (a file whose bytes another level stored exactly
        # would be stored as that blob), and not store.mount(): its lossy=off
        # for bit-exact tests would refine the level.
        store.backing = os.path.join(os.path.dirname(store.backing), f"backing-{level}")
        os.makedirs(store.backing)
        r = subprocess.run([CKPTFS, "mount", store.backing, store.mnt, "-o", f"log={store.log},level={level}"],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        store.pid = int(os.getxattr(store.mnt, "user.ckptfs.pid"))
        assert os.getxattr(store.mnt, "user.ckptfs.level").decode() == level
        os.makedirs(store.path(level))
        for i, (_, data) in enumerate(runs):
            with open(store.path(level, f"ckpt-{i}.pt"), "wb") as f:
                f.write(data)
        store.wait_idle()
        for i, (sd, data) in enumerate(runs):
            p = store.path(level, f"ckpt-{i}.pt")
            if max_err == 0:
                with open(p, "rb") as f:
                    assert f.read() == data
            else:
                assert weight_error(p, sd) <= max_err * 1.001, level
            # Each file says which level stored it, mounted and offline.
            assert os.getxattr(p, "user.ckptfs.level").decode() == level
            assert "user.ckptfs.level" not in os.listxattr(p)  # not a user attribute to copy
        logical = sum(len(d) for _, d in runs)
        stored = sum(int(os.getxattr(store.path(level, f"ckpt-{i}.pt"), "user.ckptfs.stored_bytes"))
                     for i in range(len(runs)))
        ratio[level] = logical / stored
        store.umount()
        offline = json.loads(store.cli("stats", store.backing, "--json").stdout)
        assert {f["level"] for f in offline["files"]} == {level}
    assert ratio["lossless"] < ratio["safe"] < ratio["default"] < ratio["compact"] < ratio["max"], ratio


def test_mount_help_lists_the_levels():
    r = subprocess.run([CKPTFS, "mount", "--help"], capture_output=True, text=True)
    assert r.returncode == 0
    for level in ("lossless", "safe", "default", "compact", "max"):
        assert f"  {level}" in r.stdout


def test_an_unknown_level_is_refused(store):
    r = store.mount("level=fastest", check=False)
    assert r.returncode != 0 and "level" in r.stderr
