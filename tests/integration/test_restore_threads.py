"""`ckptfs restore` decodes on several threads (--threads, default one per
core): a delta chain of lossy versions restores to the same bytes the
mount reads, whatever the thread count, and a damaged chunk fails the
restore with the file named."""
import json
import os

import pytest

np = pytest.importorskip("numpy")


def test_restore_of_a_delta_chain_is_the_same_on_any_thread_count(store, tmp_path):
    store.mount()
    rng = np.random.default_rng(3)
    w = rng.standard_normal(3 << 20).astype(np.float32)  # 12 MiB: several chunks
    for step in range(3):
        os.makedirs(store.path(f"step-{step}"), exist_ok=True)
        np.save(store.path(f"step-{step}", "w.npy"), w)
        store.wait_idle()
        w = w + rng.standard_normal(w.size).astype(np.float32) * np.float32(1e-3)
    with open(store.path("step-2", "w.npy"), "rb") as f:
        mounted = f.read()
    assert int(os.getxattr(store.path("step-2", "w.npy"), "user.ckptfs.chain_depth")) == 2
    store.umount()
    manifest = os.path.join(store.backing, "step-2", "w.npy")
    outs = []
    for threads in ("1", "3"):
        out = tmp_path / f"out-{threads}.npy"
        store.cli("restore", manifest, str(out), "--threads", threads)
        outs.append(out.read_bytes())
    store.cli("restore", manifest, str(tmp_path / "out-default.npy"))
    outs.append((tmp_path / "out-default.npy").read_bytes())
    assert all(o == mounted for o in outs)
    r = store.cli("restore", manifest, str(tmp_path / "x"), "--threads", "0", check=False)
    assert r.returncode == 1  # usage

    # Damage the middle of the key frame's last chunk: every version reads it.
    key = os.path.join(store.backing, "step-0", "w.npy")
    obj = json.loads(store.cli("inspect", key, "--json").stdout)["object"]
    path = os.path.join(store.backing, ".ckptfs", "objects", obj[:2], obj)
    last = json.loads(store.cli("inspect-blob", path, "--json").stdout)["chunks"][-1]
    os.chmod(path, 0o644)
    with open(path, "r+b") as f:
        f.seek(last["stored_offset"] + last["stored_bytes"] // 2)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0x40]))
    r = store.cli("restore", manifest, str(tmp_path / "out-1.npy"), "--threads", "3", check=False)
    assert r.returncode == 2, r.stderr
    assert "step-2/w.npy" in r.stderr
    assert (tmp_path / "out-1.npy").read_bytes() == mounted  # the earlier output is left as it was
