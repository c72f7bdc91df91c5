"""Two daemons on one backing directory, each writing its own rank's shards
and reading the other's, with GC running from either side (fs/STORE.md §5)."""
import io
import json
import os
import subprocess
import threading
import time

import pytest

from conftest import CKPTFS, force_unmount

torch = pytest.importorskip("torch")


def read(path):
    with open(path, "rb") as f:
        return f.read()


def shard(rank, step, scale=1):
    g = torch.Generator().manual_seed(1000 * rank + 7)
    d = {f"layer{i}.weight": torch.randn(256 * scale, 256, generator=g) + 0.001 * step for i in range(4)}
    d["step"] = torch.tensor([step])
    buf = io.BytesIO()
    torch.save(d, buf)
    return buf.getvalue()


class Second:
    """A second daemon on the first one's backing directory."""

    def __init__(self, store, tmp_path, opts=""):
        self.mnt = str(tmp_path / "mnt2")
        os.makedirs(self.mnt, exist_ok=True)
        o = f"log={tmp_path}/second.log,loglevel=debug,gc_interval=0,lossy=off" + ("," + opts if opts else "")
        r = subprocess.run([CKPTFS, "mount", store.backing, self.mnt, "-o", o], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr

    def path(self, *parts):
        return os.path.join(self.mnt, *parts)

    def pending(self):
        return int(os.getxattr(self.mnt, "user.ckptfs.pending"))

    def wait_idle(self):
        deadline = time.time() + 60
        while self.pending():
            assert time.time() < deadline
            time.sleep(0.02)

    def umount(self):
        r = subprocess.run([CKPTFS, "umount", self.mnt], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr


def gc(store, *args):
    return store.cli("gc", store.backing, "--json", *args).stdout


def test_two_ranks_write_shards_read_each_other_and_gc_is_safe(store, tmp_path):
    # The first daemon also collects garbage on its own, every second, with
    # a grace period far longer than a commit.
    store.mount("gc_interval=1,gc_grace=60")
    second = Second(store, tmp_path)
    mounts = [store, second]
    rotated = []  # objects of deleted shards (retained shards may delta on them)
    try:
        for step in range(4):
            os.makedirs(store.path(f"step-{step}"), exist_ok=True)
            data = [shard(rank, step, scale=8) for rank in range(2)]
            # Each rank writes its shard; while the commits run, GC runs from
            # the command line (default grace) as well as in daemon 1.
            def save(rank, step=step, data=data):
                with open(mounts[rank].path(f"step-{step}", f"rank{rank}.pt"), "wb") as f:
                    f.write(data[rank])

            writers = [threading.Thread(target=save, args=(r,)) for r in range(2)]
            for w in writers:
                w.start()
            runs = 0
            while any(w.is_alive() for w in writers) or store.pending() or second.pending() or runs < 2:
                gc(store)
                runs += 1
            for w in writers:
                w.join()
            # Every rank reads the other's shard through its own mount.
            for r in range(2):
                other = 1 - r
                assert read(mounts[r].path(f"step-{step}", f"rank{other}.pt")) == data[other]
            if step >= 2:  # keep the last two steps, like a checkpoint rotation
                for r in range(2):
                    old = mounts[r].path(f"step-{step - 2}", f"rank{r}.pt")
                    rotated.append(os.getxattr(old, "user.ckptfs.object").decode())
                    os.unlink(old)
                os.rmdir(store.path(f"step-{step - 2}"))
        store.wait_idle()
        second.wait_idle()
        # Age every object past the grace period, then collect from daemon 2's
        # side: only the rotated-out shards may go.
        for dirpath, _, names in os.walk(os.path.join(store.backing, ".ckptfs", "objects")):
            for n in names:
                os.utime(os.path.join(dirpath, n), (time.time() - 7200, time.time() - 7200))
        gc(store)
        objects = os.path.join(store.backing, ".ckptfs", "objects")
        # A rotated-out shard's object stays only as a delta base of a
        # retained shard of its rank (the previous step's file of a rank is
        # its delta base), down to the key frame.
        needed = set()
        for step in (2, 3):
            for r in range(2):
                o = os.getxattr(store.path(f"step-{step}", f"rank{r}.pt"), "user.ckptfs.object").decode()
                while o and o not in needed:
                    needed.add(o)
                    desc = json.loads(store.cli("inspect-blob", os.path.join(objects, o[:2], o), "--json").stdout)
                    o = desc.get("base") or ""
        assert not [o for o in rotated if os.path.exists(os.path.join(objects, o[:2], o)) and o not in needed]
        for m in mounts:
            for step in (2, 3):
                for r in range(2):
                    assert read(m.path(f"step-{step}", f"rank{r}.pt")) == shard(r, step, scale=8)
        second.umount()
    finally:
        force_unmount(second.mnt)
    store.umount()
    store.mount()  # fresh caches: everything must come from the objects on disk
    for step in (2, 3):
        for r in range(2):
            assert read(store.path(f"step-{step}", f"rank{r}.pt")) == shard(r, step, scale=8)
    store.umount()
    r = store.cli("fsck", store.backing, check=False)
    assert r.returncode == 0, r.stdout


def test_gc_never_deletes_a_delta_base_chosen_by_another_daemon(store, tmp_path):
    """Daemon 2 deltas new versions against old ones that daemon 1 just
    deleted (a checkpoint rotation); GC runs from daemon 1's side before and
    during the commits. In d/ the base is young and a delta on an old blob
    (kept: below a young one); in e/ GC removes the old base before daemon 2
    uses it, which daemon 2 still has open from an earlier read."""
    store.mount()
    second = Second(store, tmp_path, "keyframe=100")
    objects = os.path.join(store.backing, ".ckptfs", "objects")

    def obj_path(o):
        return os.path.join(objects, o[:2], o)

    def age(o):
        os.utime(obj_path(o), (time.time() - 7200, time.time() - 7200))

    try:
        versions = {}
        for d, n in (("d", 2), ("e", 1)):
            os.makedirs(second.path(d))
            for i in range(n):
                data = shard(1 if d == "d" else 2, i, scale=8)  # no object shared by d/ and e/
                with open(second.path(d, f"v{i}.pt"), "wb") as f:
                    f.write(data)
                second.wait_idle()
                assert read(second.path(d, f"v{i}.pt")) == data  # daemon 2 keeps the blob open
                versions[(d, i)] = os.getxattr(second.path(d, f"v{i}.pt"), "user.ckptfs.object").decode()
        for (d, i) in versions:
            os.unlink(store.path(d, f"v{i}.pt"))  # through daemon 1
        age(versions[("d", 0)])  # d/v1 stays young, its base d/v0 is old
        age(versions[("e", 0)])
        gc(store)
        assert not os.path.exists(obj_path(versions[("e", 0)]))  # old and unreferenced
        assert os.path.exists(obj_path(versions[("d", 1)]))  # young
        assert os.path.exists(obj_path(versions[("d", 0)]))  # old, but below a young blob
        new = {"d": shard(1, 5, scale=8), "e": shard(2, 5, scale=8)}
        done = threading.Event()

        def collect():
            while not done.is_set():
                gc(store)

        collector = threading.Thread(target=collect)
        collector.start()
        try:
            for d, data in new.items():
                with open(second.path(d, "new.pt"), "wb") as f:
                    f.write(data)
            second.wait_idle()
        finally:
            done.set()
            collector.join()
        second.umount()
    finally:
        force_unmount(second.mnt)
    store.umount()
    store.mount()  # fresh caches: everything must come from the objects on disk
    for d, data in new.items():
        assert read(store.path(d, "new.pt")) == data, d
    store.umount()
    r = store.cli("fsck", store.backing, check=False)
    assert r.returncode == 0, r.stdout


def save_at_once(*saves):
    """Writes each (path, bytes) on a thread of its own, all released at the
    same moment (two nodes' saves)."""
    start = threading.Barrier(len(saves))

    def save(path, data):
        start.wait()
        with open(path, "wb") as f:
            f.write(data)

    threads = [threading.Thread(target=save, args=s) for s in saves]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def test_both_daemons_publish_the_same_content_at_once(store, tmp_path):
    """Two nodes saving the same bytes at the same moment (replicated
    weights, a copied checkpoint) publish one object: content addressing and
    the atomic rename into objects/ make the second publication a no-op or
    a rename over equal bytes (DESIGN.md §3, invariant 6)."""
    store.mount()
    second = Second(store, tmp_path)
    try:
        rounds = []
        for r in range(4):
            data = os.urandom(6 << 20)
            rounds.append(data)
            save_at_once((store.path(f"a{r}.bin"), data), (second.path(f"b{r}.bin"), data))
        store.wait_idle()
        second.wait_idle()
        for r, data in enumerate(rounds):
            # Each node reads its own file and the other's.
            for path in (store.path(f"a{r}.bin"), store.path(f"b{r}.bin"), second.path(f"a{r}.bin"),
                         second.path(f"b{r}.bin")):
                assert read(path) == data, path
            a = os.getxattr(store.path(f"a{r}.bin"), "user.ckptfs.object").decode()
            b = os.getxattr(second.path(f"b{r}.bin"), "user.ckptfs.object").decode()
            assert a == b, f"round {r}: equal bytes stored as two objects"
        second.umount()
    finally:
        force_unmount(second.mnt)
    store.umount()
    r = store.cli("fsck", store.backing, check=False)
    assert r.returncode == 0, r.stdout
    tmp = os.path.join(store.backing, ".ckptfs", "tmp")
    assert not [n for d, _, files in os.walk(tmp) for n in files], "temporary objects left behind"


def test_both_daemons_save_one_path_and_one_whole_version_wins(store, tmp_path):
    """Two nodes saving the same file name at the same moment (a job
    restarted on another node while the old one still runs): readers on
    both nodes then see one whole version, never a mix of the two, and the
    store stays consistent."""
    store.mount()
    second = Second(store, tmp_path)
    try:
        for r in range(4):
            a, b = os.urandom(5 << 20), os.urandom((5 << 20) + 4096)
            save_at_once((store.path("same.bin"), a), (second.path("same.bin"), b))
            store.wait_idle()
            second.wait_idle()
            got_a, got_b = read(store.path("same.bin")), read(second.path("same.bin"))
            assert got_a in (a, b) and got_b in (a, b), f"round {r}: a mix of the two saves"
            assert got_a == got_b, f"round {r}: the two nodes read different versions"
        second.umount()
    finally:
        force_unmount(second.mnt)
    store.umount()
    store.mount()
    assert read(store.path("same.bin")) in (a, b)
    store.umount()
    r = store.cli("fsck", store.backing, check=False)
    assert r.returncode == 0, r.stdout
