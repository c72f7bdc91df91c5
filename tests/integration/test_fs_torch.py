"""Real PyTorch checkpoints through the mount (Debian's python3-torch)."""
import io
import json
import mmap
import os
import shutil
import subprocess

import pytest

torch = pytest.importorskip("torch")
torch.set_num_threads(2)

from conftest import CKPTFS  # noqa: E402


def model_state(seed, drift=0.0, base=None):
    g = torch.Generator().manual_seed(seed)
    if base is None:
        return {
            "model": {
                "fc1.weight": torch.randn(256, 512, generator=g),
                "fc1.bias": torch.randn(256, generator=g),
                "emb": torch.randn(1000, 64, generator=g).half(),
                "steps": torch.arange(10, dtype=torch.int64),
            },
            "optimizer": {"lr": 0.01, "state": {0: {"exp_avg": torch.randn(256, 512, generator=g)}}},
            "epoch": seed,
        }
    out = {"model": {}, "optimizer": {"lr": 0.01, "state": {0: {}}}, "epoch": seed}
    for k, v in base["model"].items():
        out["model"][k] = v + (drift * torch.randn(v.shape, generator=g)).to(v.dtype) if v.is_floating_point() else v
    ea = base["optimizer"]["state"][0]["exp_avg"]
    out["optimizer"]["state"][0]["exp_avg"] = ea + drift * torch.randn(ea.shape, generator=g)
    return out


def assert_same(a, b):
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_same(a[k], b[k])
    else:
        assert a == b


def test_save_load_roundtrip_bit_exact(mnt, tmp_path):
    sd = model_state(1)
    p = mnt.path("ckpt.pt")
    torch.save(sd, p)
    assert_same(torch.load(p), sd)  # served from staging or committed
    mnt.wait_idle()
    ref = tmp_path / "ckpt.pt"  # same basename: torch.save uses it as the archive prefix
    torch.save(sd, ref)
    with open(ref, "rb") as f:
        want = f.read()
    with open(p, "rb") as f:
        got = f.read()
    assert got == want
    # mmap and read() agree on the committed file
    with open(p, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as mm:
        assert mm[:] == got
    assert_same(torch.load(p), sd)
    mnt.umount()
    mnt.mount()
    assert_same(torch.load(p), sd)
    with open(p, "rb") as f:
        assert f.read() == want


def test_tmp_then_replace_and_bytesio_copy(mnt, tmp_path):
    sd = model_state(2)
    torch.save(sd, mnt.path("a.pt.tmp"))
    os.replace(mnt.path("a.pt.tmp"), mnt.path("a.pt"))
    assert_same(torch.load(mnt.path("a.pt")), sd)
    # Lightning-style: save to BytesIO, write it in $TMPDIR, copy2 into the mount.
    buf = io.BytesIO()
    torch.save(sd, buf)
    local = tmp_path / "local.pt"
    local.write_bytes(buf.getvalue())
    shutil.copy2(local, mnt.path("b.pt"))
    assert_same(torch.load(mnt.path("b.pt")), sd)
    with open(mnt.path("b.pt"), "rb") as f:
        assert f.read() == buf.getvalue()
    mnt.wait_idle()
    assert_same(torch.load(mnt.path("a.pt")), sd)


def test_keep_last_3_rotation(mnt):
    d = mnt.path("run")
    os.makedirs(d)
    state = model_state(3)
    kept = {}
    for step in range(10):
        state = model_state(100 + step, drift=1e-3, base=state)
        name = os.path.join(d, f"ckpt-{step}.pt")
        torch.save(state, name)
        kept[name] = state
        mnt.wait_idle()  # as a trainer between checkpoints
        while len(kept) > 3:
            oldest = min(kept, key=lambda n: int(n.rsplit("-", 1)[1][:-3]))
            os.unlink(oldest)
            del kept[oldest]
    assert sorted(os.listdir(d)) == ["ckpt-7.pt", "ckpt-8.pt", "ckpt-9.pt"]
    r = subprocess.run([CKPTFS, "gc", mnt.backing, "--grace", "0"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    for name, sd in kept.items():
        assert_same(torch.load(name), sd)
    r = subprocess.run([CKPTFS, "stats", d, "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    stats = json.loads(r.stdout)
    assert len(stats["files"]) == 3
    assert any(f["chain_depth"] > 0 for f in stats["files"]), stats  # deltas against older versions
    mnt.umount()
    mnt.mount()
    for name, sd in kept.items():
        assert_same(torch.load(name), sd)


def test_delta_base_survives_remount(store):
    """The first checkpoint after a remount deltas against the versions
    already in its directory instead of starting a new key frame."""
    store.mount()
    d = store.path("run")
    os.makedirs(d)
    state = model_state(5)
    for step in range(2):
        state = model_state(200 + step, drift=1e-3, base=state)
        torch.save(state, os.path.join(d, f"ckpt-{step}.pt"))
        store.wait_idle()
    store.umount()
    store.mount()
    state = model_state(300, drift=1e-3, base=state)
    p = os.path.join(d, "ckpt-2.pt")
    torch.save(state, p)
    store.wait_idle()
    r = subprocess.run([CKPTFS, "stats", d, "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    files = {os.path.basename(f["path"]): f for f in json.loads(r.stdout)["files"]}
    assert files["ckpt-2.pt"]["chain_depth"] == files["ckpt-1.pt"]["chain_depth"] + 1, files
    assert_same(torch.load(p), state)


def test_a_file_saved_over_in_place_deltas_after_remount(store):
    """A trainer that saves over one name (`last.ckpt`) and is restarted: its
    first save after the remount deltas against the file's own previous
    version, as every save before did (a daemon restart used to cost such a
    file a key frame), also when it fsyncs the save."""
    store.mount()
    p = store.path("last.ckpt")
    state = model_state(7)
    for step in range(2):
        state = model_state(400 + step, drift=1e-3, base=state)
        torch.save(state, p)
        store.wait_idle()
    before = os.getxattr(p, "user.ckptfs.object").decode()
    assert int(os.getxattr(p, "user.ckptfs.chain_depth")) == 1
    store.umount()
    store.mount()
    state = model_state(500, drift=1e-3, base=state)
    torch.save(state, p)
    store.wait_idle()
    assert os.getxattr(p, "user.ckptfs.base").decode() == before
    assert int(os.getxattr(p, "user.ckptfs.chain_depth")) == 2
    # A careful trainer fsyncs its save: the fsync puts a staging record in
    # the manifest, in place of the version the commit deltas against.
    before = os.getxattr(p, "user.ckptfs.object").decode()
    store.umount()
    store.mount()
    state = model_state(600, drift=1e-3, base=state)
    with open(p, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    store.wait_idle()
    assert os.getxattr(p, "user.ckptfs.base").decode() == before
    assert int(os.getxattr(p, "user.ckptfs.chain_depth")) == 3
    store.umount()
    store.mount()
    assert_same(torch.load(p), state)
