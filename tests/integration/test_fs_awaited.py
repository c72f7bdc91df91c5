"""A cold read of a step-predicted checkpoint keeps the optimizer state its
weights decoded ahead of the reader until the reader gets there (awaited
chunks, fs/README.md): it decodes fewer chunks than the same read through
an LRU of the same size alone (mem=, which leaves no room for them), and
both read the same bytes."""
import hashlib
import os

import pytest

torch = pytest.importorskip("torch")


def checkpoints(versions):
    # Linear layers with Adam, one real step apart: the later versions'
    # weights are coded against the step their optimizer state gives.
    torch.manual_seed(0)
    torch.set_num_threads(2)
    model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(4)])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(64, 1024)
    for step in range(versions):
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
        yield {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}


def decoded(mnt):
    return int(os.getxattr(mnt.mnt, "user.ckptfs.decoded_chunks"))


def cold_load(mnt, opts, path):
    mnt.mount(opts)
    try:
        before = decoded(mnt)
        with open(path, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        loaded = torch.load(path)
        return decoded(mnt) - before, digest, loaded
    finally:
        mnt.umount()


def test_a_cold_read_decodes_the_state_its_weights_read_once(store):
    # No decode-ahead workers and the fewest request threads: which chunks
    # the LRU still holds then depends less on how threads interleave. With
    # them, a read through the awaited room took 281-416 decodes over 26
    # runs (once 416 against the LRU alone's 416, and the test failed);
    # without, 284-286 over 8 runs, against 421-557 for the LRU alone.
    lossy = "lossy=on,cache=16,decode_ahead=0,fuse_threads=2"
    store.mount(lossy)
    for k, ckpt in enumerate(checkpoints(4)):
        os.makedirs(store.path(f"step-{k}"))
        torch.save(ckpt, store.path(f"step-{k}", "ckpt.pt"))
        store.wait_idle()
    newest = store.path("step-3", "ckpt.pt")
    assert int(os.getxattr(newest, "user.ckptfs.chain_depth")) == 3
    store.umount()

    # 48 MB a version, 32 MB of it Adam state: more than the 16 MiB LRU.
    with_room, digest, loaded = cold_load(store, lossy, newest)
    # mem=32: the same 16 MiB LRU, no room for awaited chunks.
    lru_only, digest_lru, loaded_lru = cold_load(store, lossy + ",mem=32", newest)
    assert digest == digest_lru
    for name, t in loaded["model"].items():
        assert torch.equal(t, loaded_lru["model"][name]), name
    assert with_room > 0
    assert with_room < 0.9 * lru_only, (with_room, lru_only)
