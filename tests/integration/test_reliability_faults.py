"""Faults of the backing store: full, read-only, objects damaged under a
running daemon, and a restart with another lossy policy (docs/reliability.md)."""
import errno
import io
import json
import mmap
import os
import subprocess
import time

import pytest

from conftest import state

torch = pytest.importorskip("torch")


def read(path):
    with open(path, "rb") as f:
        return f.read()


def write(path, data):
    with open(path, "wb") as f:
        f.write(data)


def object_path(m, name):
    obj = os.getxattr(m.path(name), "user.ckptfs.object").decode()
    return os.path.join(m.backing, ".ckptfs", "objects", obj[:2], obj)


@pytest.fixture
def tmpfs_store(store):
    """`store` whose backing directory is a fresh 64 MiB tmpfs."""
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", store.backing],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {r.stderr.strip()}")
    try:
        yield store
    finally:
        store.teardown()
        subprocess.run(["umount", "-l", store.backing], capture_output=True)


def free_bytes(path):
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def wait_free(path, at_least, timeout=20):
    """Deleting returns the space once the kernel forgets the inode (FORGET
    comes asynchronously): poll."""
    deadline = time.time() + timeout
    while free_bytes(path) < at_least:
        if time.time() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_full_backing_store_fails_writes_and_recovers(tmpfs_store):
    m = tmpfs_store
    m.mount()
    keep = os.urandom(8 << 20)
    write(m.path("keep"), keep)
    m.wait_idle()
    assert state(m.path("keep")) == "committed"
    empty_free = free_bytes(m.mnt)

    # 1. A file larger than the space left: write() itself reports ENOSPC
    # (every write reaches the staging file on the backing store at once).
    with pytest.raises(OSError) as e:
        with open(m.path("huge"), "wb") as f:
            for _ in range(100):
                f.write(os.urandom(1 << 20))
    assert e.value.errno == errno.ENOSPC
    m.wait_idle()

    # 2. A file whose staging copy fits but whose object does not: close()
    # succeeds (the commit is asynchronous), the commit fails with ENOSPC,
    # the bytes stay readable from the fsynced staging file.
    os.unlink(m.path("huge"))
    m.wait_idle()
    assert wait_free(m.mnt, empty_free - (1 << 20)), "deleting the failed file did not free its space"
    mid = os.urandom(int(free_bytes(m.mnt) * 0.6))
    write(m.path("mid"), mid)
    m.wait_idle()
    assert read(m.path("mid")) == mid
    assert state(m.path("mid")) == "staging"  # not committed: no room for its object

    # Nothing committed is damaged and the daemon keeps serving.
    assert read(m.path("keep")) == keep
    write(m.path("small"), b"still writable")
    assert read(m.path("small")) == b"still writable"

    # 3. Deleting frees the space again (the failed commit's staging file
    # goes with the file), and gc returns the space of dead objects.
    os.unlink(m.path("mid"))
    os.unlink(m.path("keep"))
    m.wait_idle()
    m.cli("gc", m.backing, "--grace", "0")
    assert wait_free(m.mnt, empty_free + (6 << 20)), "deleting did not free the space"
    again = os.urandom(20 << 20)
    write(m.path("again"), again)
    m.wait_idle()
    assert state(m.path("again")) == "committed"
    assert read(m.path("again")) == again
    m.umount()
    r = m.cli("fsck", m.backing, check=False)
    assert r.returncode == 0, r.stdout
    assert os.listdir(os.path.join(m.backing, ".ckptfs", "staging")) == []


def test_commit_retries_once_space_is_back(tmpfs_store):
    m = tmpfs_store
    m.mount()
    empty_free = free_bytes(m.mnt)
    filler = os.urandom(int(empty_free * 0.3))
    write(m.path("filler"), filler)
    m.wait_idle()
    # The filler's staging file gives its space back after the commit (the
    # daemon lets go of it in the background): measured before that, the
    # free space was low enough for mid's object to fit after all.
    assert wait_free(m.mnt, empty_free - len(filler) - (1 << 20)), "the filler's staging space did not come back"
    mid = os.urandom(int(free_bytes(m.mnt) * 0.6))
    write(m.path("mid"), mid)  # its object does not fit
    m.wait_idle()
    assert state(m.path("mid")) == "staging"
    before = free_bytes(m.mnt)
    os.unlink(m.path("filler"))
    m.wait_idle()
    m.cli("gc", m.backing, "--grace", "0")
    assert wait_free(m.mnt, before + len(filler) // 2)
    m.umount()  # the remount retries the commit (recovery)
    m.mount()
    assert state(m.path("mid")) == "committed"
    assert read(m.path("mid")) == mid
    m.umount()
    assert m.cli("fsck", m.backing, check=False).returncode == 0


def test_read_only_backing_store_mounts_read_only(tmpfs_store):
    m = tmpfs_store
    m.mount()
    data = os.urandom(2 << 20)
    write(m.path("a"), data)
    m.wait_idle()
    # A file a killed daemon left in staging (fsynced, never committed).
    synced = os.urandom(1 << 20)
    f = open(m.path("synced"), "wb")
    f.write(synced)
    f.flush()
    os.fsync(f.fileno())
    m.kill9()
    try:
        f.close()
    except OSError:
        pass
    subprocess.run(["mount", "-o", "remount,ro", m.backing], check=True)
    r = m.mount(check=False)
    assert r.returncode == 0, r.stderr
    m.pid = int(os.getxattr(m.mnt, "user.ckptfs.pid"))
    assert "read-only" in open(m.log).read()
    assert read(m.path("a")) == data
    assert read(m.path("synced")) == synced  # from its staging file: no recovery on a read-only store
    with pytest.raises(OSError) as e:
        write(m.path("b"), b"x")
    assert e.value.errno == errno.EROFS
    with pytest.raises(OSError) as e:
        write(m.path("a"), b"x")
    assert e.value.errno == errno.EROFS
    m.umount()
    subprocess.run(["mount", "-o", "remount,rw", m.backing], check=True)
    m.mount()  # writable again: recovery commits the staged file
    assert read(m.path("a")) == data
    assert read(m.path("synced")) == synced
    assert state(m.path("synced")) == "committed"


def test_objects_damaged_under_a_running_daemon(store):
    store.mount()
    # One directory each: no file is a delta base candidate of another, so
    # no decoded chunk of one is cached by the commit of the next.
    files = {n: os.urandom(3 << 20) for n in ("flipped/f", "deleted/f", "fine/f")}
    for n, d in files.items():
        os.mkdir(store.path(os.path.dirname(n)))
        write(store.path(n), d)
    store.wait_idle()
    flipped, deleted = object_path(store, "flipped/f"), object_path(store, "deleted/f")
    os.chmod(flipped, 0o644)
    desc = json.loads(store.cli("inspect-blob", flipped, "--json").stdout)
    chunk = desc["chunks"][0]
    with open(flipped, "r+b") as f:
        f.seek(chunk["stored_offset"] + chunk["stored_bytes"] // 2)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0x01]))
    os.unlink(deleted)

    def read_uncached(path):
        # The kernel may still cache the bytes written: O_DIRECT makes the
        # daemon read the objects.
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        try:
            buf = mmap.mmap(-1, 1 << 20)  # page aligned
            out = bytearray()
            while n := os.readv(fd, [buf]):
                out += buf[:n]
            return bytes(out)
        finally:
            os.close(fd)

    for n in ("flipped/f", "deleted/f"):
        with pytest.raises(OSError) as e:
            read_uncached(store.path(n))
        assert e.value.errno == errno.EIO, n
    assert read_uncached(store.path("fine/f")) == files["fine/f"]
    r = store.cli("fsck", store.backing, "--json", check=False)
    assert r.returncode == 4
    report = json.loads(r.stdout)
    text = json.dumps(report["problems"])
    assert os.path.basename(flipped) in text and os.path.basename(deleted) in text
    assert "fine" not in text
    # The damaged files can be replaced; the replacement reads back.
    write(store.path("deleted/f"), b"new content " * 1000)
    store.wait_idle()
    assert read(store.path("deleted/f")) == b"new content " * 1000
    store.umount()


def tensors(seed, step=0):
    g = torch.Generator().manual_seed(seed)
    d = {"w": torch.randn(256, 512, generator=g), "b": torch.randn(512, generator=g),
         "step": torch.tensor([step])}
    if step:
        d["w"] += 0.01 * step
    buf = io.BytesIO()
    torch.save(d, buf)
    return d, buf.getvalue()


def close_enough(got_bytes, want, budget):
    got = torch.load(io.BytesIO(got_bytes))
    assert set(got) == set(want)
    for k, w in want.items():
        if not w.is_floating_point():
            assert torch.equal(got[k], w), k
            continue
        err = torch.linalg.norm(got[k].double() - w.double()) / torch.linalg.norm(w.double())
        assert err <= budget * 1.0001, (k, float(err), budget)


def test_restart_with_another_policy_reads_every_old_file(store, tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text('[defaults]\nmode = "lossless"\n\n[[rule]]\nfiles = "p/*"\nmode = "lossy"\nrel_l2 = 0.03\n')
    configs = [("lossy=off", 0.0), ("lossy=on,budget=0.01", 0.01), ("lossy=on,budget=0.05", 0.05),
               (f"lossy=on,policy={policy}", None)]
    written = []  # (path, tensors, budget it was written under)
    for i, (opts, budget) in enumerate(configs):
        store.mount(opts)
        os.makedirs(store.path("p"), exist_ok=True)
        for rel in (f"ckpt-{i}.pt", f"p/ckpt-{i}.pt", "same.pt"):
            # same.pt: a new version of one file under every policy, deltas across them.
            want, data = tensors(100 + i, step=i)
            write(store.path(rel), data)
            b = budget if budget is not None else (0.03 if rel.startswith("p/") else 0.0)
            written = [w for w in written if w[0] != rel] + [(rel, want, b, data)]
        store.wait_idle()
        store.umount()
        for later_opts, _ in configs:  # every config reads everything written so far
            store.mount(later_opts)
            for rel, want, b, data in written:
                got = read(store.path(rel))
                assert len(got) == len(data), rel
                if b == 0.0:
                    assert got == data, (rel, later_opts)
                else:
                    close_enough(got, want, b)
            store.umount()
    r = store.cli("fsck", store.backing, check=False)
    assert r.returncode == 0, r.stdout
