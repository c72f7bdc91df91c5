"""Randomized operations against a reference directory on the local disk:
after each step the touched files must read back identically from the mount
and the reference, and the whole tree must match after a remount."""
import os
import random

import pytest

NAMES = [f"f{i}" for i in range(6)] + [f"sub/g{i}" for i in range(3)]
MAX_SIZE = 300_000


def read_all(path):
    with open(path, "rb") as f:
        return f.read()


def tree(root):
    out = {}
    for dirpath, _, files in os.walk(root):
        for n in files:
            p = os.path.join(dirpath, n)
            out[os.path.relpath(p, root)] = read_all(p)
    return out


class Twin:
    """Applies every operation to the mount and to the reference."""

    def __init__(self, mnt, ref, rng):
        self.roots = (mnt, ref)
        self.rng = rng
        self.handles = []  # (name, fd_mnt, fd_ref)

    def exists(self, name):
        return os.path.exists(os.path.join(self.roots[1], name))

    def both(self, fn):
        results = []
        for root in self.roots:
            try:
                results.append(("ok", fn(root)))
            except OSError as e:
                results.append(("err", e.errno))
        assert results[0] == results[1], results
        return results[0]

    def check(self, name):
        a = os.path.join(self.roots[0], name)
        b = os.path.join(self.roots[1], name)
        assert os.path.exists(a) == os.path.exists(b), name
        if os.path.exists(b):
            assert os.path.getsize(a) == os.path.getsize(b), name
            assert read_all(a) == read_all(b), name

    def step(self):
        r = self.rng
        name = r.choice(NAMES)
        op = r.choice(["write", "pwrite", "pwrite", "truncate", "rename", "unlink", "read", "open", "close",
                       "hwrite", "append"])
        data = r.randbytes(r.choice([1, 100, 4096, 5000, 70_000]))
        if op == "write":
            def f(root):
                with open(os.path.join(root, name), "wb") as fh:
                    fh.write(data)
            self.both(f)
        elif op == "append":
            def f(root):
                with open(os.path.join(root, name), "ab") as fh:
                    fh.write(data)
            self.both(f)
        elif op == "pwrite":
            off = r.randrange(MAX_SIZE - len(data))
            def f(root):
                fd = os.open(os.path.join(root, name), os.O_WRONLY)
                try:
                    os.pwrite(fd, data, off)
                finally:
                    os.close(fd)
            self.both(f)
        elif op == "truncate":
            size = r.choice([0, 1, 4095, 4097, r.randrange(MAX_SIZE)])
            self.both(lambda root: os.truncate(os.path.join(root, name), size))
        elif op == "rename":
            other = r.choice(NAMES)
            self.both(lambda root: os.rename(os.path.join(root, name), os.path.join(root, other)))
            self.check(other)
        elif op == "unlink":
            self.both(lambda root: os.unlink(os.path.join(root, name)))
        elif op == "read":
            off = r.randrange(MAX_SIZE)
            def f(root):
                fd = os.open(os.path.join(root, name), os.O_RDONLY)
                try:
                    return os.pread(fd, 10_000, off)
                finally:
                    os.close(fd)
            self.both(f)
        elif op == "open" and len(self.handles) < 4 and self.exists(name):
            fds = [os.open(os.path.join(root, name), os.O_RDWR) for root in self.roots]
            self.handles.append((name, *fds))
        elif op == "close" and self.handles:
            _, a, b = self.handles.pop(r.randrange(len(self.handles)))
            os.close(a)
            os.close(b)
        elif op == "hwrite" and self.handles:
            # write through a long-lived handle (its file may be renamed or unlinked meanwhile)
            _, a, b = r.choice(self.handles)
            off = r.randrange(MAX_SIZE - len(data))
            os.pwrite(a, data, off)
            os.pwrite(b, data, off)
            assert os.pread(a, len(data), off) == os.pread(b, len(data), off)
        self.check(name)

    def close_all(self):
        for _, a, b in self.handles:
            os.close(a)
            os.close(b)
        self.handles = []


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_ops_match_reference(store, tmp_path, seed):
    store.mount("threads=2")
    ref = tmp_path / "ref"
    os.makedirs(ref / "sub")
    os.makedirs(store.path("sub"))
    twin = Twin(store.mnt, str(ref), random.Random(seed))
    for _ in range(3500):
        twin.step()
    twin.close_all()
    assert tree(store.mnt) == tree(str(ref))
    store.umount()
    store.mount()
    assert tree(store.mnt) == tree(str(ref))
    store.umount()
    r = store.cli("fsck", store.backing, check=False)
    assert r.returncode == 0, r.stdout
