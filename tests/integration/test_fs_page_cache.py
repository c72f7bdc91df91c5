"""The kernel's page cache of a file committed lossily (fs/kernel_copy.cc):
the daemon copies the reconstruction into it after the commit, so that a
read right after a save on the same node is served by the kernel, with the
bytes a read after a remount gets; a writer right after the commit wins
over the copy."""
import ctypes
import mmap
import os
import time

import pytest

torch = pytest.importorskip("torch")
torch.set_num_threads(2)


def xattr(path, name):
    return os.getxattr(path, f"user.ckptfs.{name}").decode()

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]


def resident_pages(path):
    """How many of the file's pages the kernel holds, without reading any
    (mincore of a shared mapping), and how many it has."""
    size = os.path.getsize(path)
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert addr not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
        try:
            vec = (ctypes.c_ubyte * pages)()
            assert _libc.mincore(addr, size, vec) == 0, os.strerror(ctypes.get_errno())
            return sum(b & 1 for b in vec), pages
        finally:
            _libc.munmap(addr, size)
    finally:
        os.close(fd)


def save_checkpoint(path, seed, layers=4, width=1024):
    g = torch.Generator().manual_seed(seed)
    torch.save({f"w{i}": torch.randn(width, width, generator=g) for i in range(layers)}, path)


def wait_committed(store, path, poll=0.02):
    deadline = time.time() + 60
    while xattr(path, "state") != "committed":
        assert time.time() < deadline, "not committed"
        time.sleep(poll)
    store.wait_idle()


@pytest.mark.parametrize("options", ["lossy=on", "lossy=on,cache=4"], ids=["cached", "spilled"])
def test_a_lossy_commit_leaves_its_reconstruction_in_the_page_cache(store, options):
    """Without any read, every page of the committed file comes to be in
    the kernel's cache (an attribute refresh does not drop them), and what
    it serves from there is the reconstruction a cold read after a remount
    decodes. `spilled`: a file over half the chunk cache, whose
    reconstruction the daemon holds for its spill."""
    store.mount(options)
    p = store.path("ckpt.pt")
    save_checkpoint(p, seed=1)
    wait_committed(store, p)
    assert "lossy" in xattr(p, "codec")
    deadline = time.time() + 30
    while True:
        os.stat(p)  # attributes refreshed: the kernel must keep the pages
        have, pages = resident_pages(p)
        if have == pages:
            break
        assert time.time() < deadline, f"{have} of {pages} pages in the kernel's cache"
        time.sleep(0.05)
    with open(p, "rb") as f:
        warm = f.read()
    store.umount()
    store.mount(options)
    with open(p, "rb") as f:
        cold = f.read()
    assert len(warm) == len(cold) and warm == cold
    torch.load(p)


@pytest.mark.parametrize("options", ["lossy=off", "lossy=on"])
def test_an_exact_commit_keeps_the_writers_pages(store, options):
    """A blob that gives back the written bytes (a checkpoint stored
    losslessly, a file that is no checkpoint) keeps the pages the writer
    left in the kernel's cache: nothing to copy, nothing to read again."""
    store.mount(options)
    p = store.path("ckpt.pt" if options == "lossy=off" else "data.bin")
    if options == "lossy=off":
        save_checkpoint(p, seed=2)
    else:
        with open(p, "wb") as f:
            f.write(os.urandom(8 << 20) + bytes(8 << 20))
    with open(p, "rb") as f:
        written = f.read()
    wait_committed(store, p)
    assert xattr(p, "codec").startswith("blob:") and "lossy" not in xattr(p, "codec")
    os.stat(p)
    have, pages = resident_pages(p)
    assert have == pages, f"{have} of {pages} pages in the kernel's cache"
    store.umount()
    store.mount(options)
    with open(p, "rb") as f:
        assert f.read() == written


@pytest.mark.parametrize("how", ["rewrite", "truncate", "append"])
def test_a_writer_right_after_the_commit_wins_over_the_copy(store, how):
    """The copy runs after the commit; a writer that comes at once (the
    next save to the same name, truncate(2), an append) must find the
    kernel's cache holding its bytes and size, never a late piece of the
    committed version, in whatever order the two meet."""
    store.mount("lossy=on,cache=4")
    p = store.path("last.pt")
    for round_ in range(4):
        save_checkpoint(p, seed=round_, layers=8)
        wait_committed(store, p, poll=0.001)
        size = os.path.getsize(p)
        tail = os.urandom(12345 + round_)
        if how == "rewrite":
            # Longer than the checkpoint: a late piece of it would stay in
            # the cache over these bytes.
            want = os.urandom(size + 12345)
            with open(p, "wb") as f:
                f.write(want)
        elif how == "truncate":
            os.truncate(p, 4096 + round_)
            want = None
        else:
            with open(p, "rb") as f:
                committed = f.read()
            with open(p, "ab") as f:
                f.write(tail)
            want = committed + tail
        for _ in range(2):  # before its commit, and after
            with open(p, "rb") as f:
                got = f.read()
            if how == "truncate":
                assert len(got) == 4096 + round_ < size
                want = got if want is None else want
            assert os.path.getsize(p) == len(want)
            assert got == want, f"round {round_}: {len(got)} bytes read, {len(want)} written"
            store.wait_idle()
    store.umount()
    store.mount("lossy=on,cache=4")
    with open(p, "rb") as f:
        assert f.read() == want
