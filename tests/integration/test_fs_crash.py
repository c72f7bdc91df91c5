"""Crash safety: kill -9 of the daemon and abort() at each commit step,
then a remount must show every acknowledged file exactly, and no
half-written file as committed (DESIGN §3 invariant 1)."""
import glob
import json
import os
import subprocess
import time

import pytest

from conftest import force_unmount, state

STEPS = ["after_staging_sync", "after_staging_manifest", "after_objects", "after_manifest",
         "before_staging_removal"]


def read(path):
    with open(path, "rb") as f:
        return f.read()


def write(path, data, fsync=False):
    with open(path, "wb") as f:
        f.write(data)
        if fsync:
            f.flush()
            os.fsync(f.fileno())


def staging_files(backing):
    return [p for p in glob.glob(os.path.join(backing, ".ckptfs", "staging", "*", "*"))]


def xattr_codec(path):
    return os.getxattr(path, "user.ckptfs.codec").decode()


def fsck_clean(m):
    r = m.cli("fsck", m.backing, check=False)
    assert r.returncode == 0, r.stdout + r.stderr


# What a commit stores: a blob key frame, a blob delta of the previous
# version, a raw object (compress=off), the bytes in the manifest (inline,
# which publishes no object: no after_objects step).
KINDS = {"blob": "", "delta": "", "raw": "compress=off", "inline": ""}


def versions_of(kind):
    if kind == "inline":
        return os.urandom(2000), os.urandom(2500)
    old = os.urandom(1 << 20)
    if kind == "delta":
        new = bytearray(old)
        new[5000:5100] = os.urandom(100)
        return old, bytes(new)
    return old, os.urandom((1 << 20) + 12345)


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("step", STEPS)
def test_crash_at_each_commit_step(store, step, kind):
    if kind == "inline" and step == "after_objects":
        pytest.skip("an inline commit publishes no object")
    old, new = versions_of(kind)
    opts = KINDS[kind]
    small_old = b"small old"
    store.mount(opts)
    write(store.path("f"), old)
    write(store.path("s"), small_old)
    store.umount()
    store.mount(",".join(o for o in (opts, f"crash_at={step}") if o))
    pid = store.pid
    write(store.path("f"), new)  # close queues the commit, which aborts at `step`
    store.pid = pid
    store.wait_dead()
    force_unmount(store.mnt)
    store.mount(opts)  # recovery runs before the mount returns
    got = read(store.path("f"))
    assert got in (old, new), "a half-written file appeared"
    if step not in ("after_staging_sync", "after_objects"):
        # From the staging manifest on, the new version is durable (the
        # mount records it once the staging file is synced and encoded).
        assert got == new
    assert read(store.path("s")) == small_old
    assert state(store.path("f")) == "committed"
    expect = {"blob": "blob", "delta": "blob", "raw": "raw", "inline": "inline"}[kind]
    assert xattr_codec(store.path("f")).startswith(expect), xattr_codec(store.path("f"))
    if kind == "delta" and got == new:
        # A delta of the previous version: committed by the daemon before it
        # died, or by the recovery, which finds the file's committed record
        # in the manifest's other slot, beside the staging record that took
        # its place (the old version is the key frame).
        assert os.getxattr(store.path("f"), "user.ckptfs.base").decode(), "not stored as a delta"
    store.umount()
    assert staging_files(store.backing) == []
    fsck_clean(store)


@pytest.mark.parametrize("step", STEPS)
def test_crash_after_fsync_keeps_the_new_version(store, step):
    # fsync() records the staging file itself: whatever step of the commit
    # that follows the close aborts, the fsynced bytes are what a remount shows.
    old, new = versions_of("delta")
    store.mount()
    write(store.path("f"), old)
    store.umount()
    store.mount(f"crash_at={step}")
    pid = store.pid
    write(store.path("f"), new, fsync=True)
    store.pid = pid
    store.wait_dead()
    force_unmount(store.mnt)
    store.mount()
    assert read(store.path("f")) == new
    assert state(store.path("f")) == "committed"
    # Committed by the daemon or by the recovery: either finds the previous
    # version the fsync's staging record replaced, and deltas against it.
    assert os.getxattr(store.path("f"), "user.ckptfs.base").decode(), "not stored as a delta"
    store.umount()
    assert staging_files(store.backing) == []
    fsck_clean(store)


def test_kill9_during_write_and_encode(store):
    store.mount()
    committed = {f"c{i}": os.urandom(300_000 + i) for i in range(3)}
    for n, d in committed.items():
        write(store.path(n), d)
    store.wait_idle()
    synced = {f"s{i}": os.urandom(2_000_000 + i) for i in range(3)}
    for n, d in synced.items():
        write(store.path(n), d, fsync=True)  # kill comes while these encode
    write(store.path("c0"), b"replacement being written", fsync=False)
    # A writer in the middle of a large file when the daemon dies.
    proc = subprocess.Popen(["/usr/bin/python3", "-c", f"""
import os, time
f = open({store.path('partial')!r}, 'wb')
for i in range(1000):
    f.write(os.urandom(65536)); f.flush(); time.sleep(0.002)
"""])
    deadline = time.time() + 20
    while not (os.path.exists(store.path("partial")) and os.path.getsize(store.path("partial")) > 0):
        assert time.time() < deadline, "the writer never started"
        time.sleep(0.01)
    store.kill9()
    proc.kill()
    proc.wait()
    store.mount()
    for n, d in synced.items():
        assert read(store.path(n)) == d, n
    for n in ("c1", "c2"):
        assert read(store.path(n)) == committed[n]
    assert read(store.path("c0")) in (committed["c0"], b"replacement being written")
    assert read(store.path("partial")) == b""  # never closed nor fsynced: the empty file it was created as
    store.umount()
    fsck_clean(store)


def test_fsync_promise_survives_kill9(store):
    store.mount("threads=1")
    data = os.urandom(3 << 20)
    f = open(store.path("journal"), "wb")
    f.write(data)
    f.flush()
    os.fsync(f.fileno())
    assert state(store.path("journal")) == "staging"
    store.kill9()  # the writer is still open
    try:
        f.close()
    except OSError:
        pass
    store.mount()
    assert read(store.path("journal")) == data
    assert state(store.path("journal")) == "committed"


def test_atomic_save_survives_kill9_before_its_commit(store):
    """The atomic save of a careful trainer: write a temporary file, fsync
    it, rename it over the checkpoint (and fsync the folder). A kill -9 of
    the daemon before the commit ends leaves the new checkpoint under the
    final name after a remount, and nothing under the temporary one."""
    store.mount("threads=1")
    old, new = os.urandom(2 << 20), os.urandom((2 << 20) + 999)
    write(store.path("ckpt.pt"), old)
    store.wait_idle()
    tmp = store.path("ckpt.pt.tmp")
    f = open(tmp, "wb")
    f.write(new)
    f.flush()
    os.fsync(f.fileno())
    os.replace(tmp, store.path("ckpt.pt"))
    dfd = os.open(store.mnt, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    store.kill9()  # the writer is still open: no commit has started
    try:
        f.close()
    except OSError:
        pass
    store.mount()
    assert read(store.path("ckpt.pt")) == new
    assert not os.path.exists(tmp)
    assert state(store.path("ckpt.pt")) == "committed"
    store.umount()
    assert staging_files(store.backing) == []
    fsck_clean(store)


def test_fsck_finds_flipped_byte_and_read_gives_eio(store, tmp_path):
    store.mount()
    data = os.urandom(12 << 20)  # three 4 MiB chunks
    write(store.path("victim"), data)
    write(store.path("bystander"), os.urandom(100_000))
    store.wait_idle()
    obj = os.getxattr(store.path("victim"), "user.ckptfs.object").decode()
    store.umount()
    fsck_clean(store)
    r = store.cli("restore", os.path.join(store.backing, "victim"), str(tmp_path / "out"))
    assert read(tmp_path / "out") == data
    path = os.path.join(store.backing, ".ckptfs", "objects", obj[:2], obj)
    os.chmod(path, 0o644)
    # Damage the payload of the last chunk only (the blob's chunk table says where).
    desc = json.loads(store.cli("inspect-blob", path, "--json").stdout)
    last = desc["chunks"][-1]
    assert last["offset"] > 4096
    with open(path, "r+b") as f:
        f.seek(last["stored_offset"] + last["stored_bytes"] // 2)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0x40]))
    r = store.cli("fsck", store.backing, "--json", check=False)
    assert r.returncode == 4, r.stdout
    assert obj in r.stdout
    # The chunk check itself finds it, not only the object's name check.
    damaged = f"chunk {len(desc['chunks']) - 1} (logical offset {last['offset']})"
    assert any(obj in p and damaged in p for p in json.loads(r.stdout)["problems"]), r.stdout
    # A restore that fails leaves the file it would have replaced as it was,
    # and no partial output beside it.
    r = store.cli("restore", os.path.join(store.backing, "victim"), str(tmp_path / "out"), check=False)
    assert r.returncode == 2
    assert read(tmp_path / "out") == data
    assert not [n for n in os.listdir(tmp_path) if "ckptfs-" in n]
    store.mount()
    with open(store.path("victim"), "rb") as f:
        assert f.read(4096) == data[:4096]  # chunks before the damage still read
        f.seek(len(data) - 2000)
        with pytest.raises(OSError) as e:
            f.read(2000)
        assert e.value.errno == 5  # EIO
    assert read(store.path("bystander"))  # other files are unaffected


def test_gc_keeps_bases_and_drops_garbage(store):
    store.mount("keyframe=100")
    os.makedirs(store.path("d"))
    base = os.urandom(1 << 20)
    write(store.path("d", "v1"), base)
    store.wait_idle()
    v2 = bytearray(base)
    v2[100:200] = os.urandom(100)
    write(store.path("d", "v2"), bytes(v2))
    store.wait_idle()
    base_id = os.getxattr(store.path("d", "v2"), "user.ckptfs.base").decode()
    v1_obj = os.getxattr(store.path("d", "v1"), "user.ckptfs.object").decode()
    write(store.path("junk"), os.urandom(200_000))
    store.wait_idle()
    junk_obj = os.getxattr(store.path("junk"), "user.ckptfs.object").decode()
    os.unlink(store.path("junk"))
    os.unlink(store.path("d", "v1"))
    store.umount()
    assert base_id == v1_obj  # v2 is stored as a delta of v1, the file deleted below
    r = store.cli("gc", store.backing, "--grace", "0", "--json")
    objects = os.path.join(store.backing, ".ckptfs", "objects")
    assert not os.path.exists(os.path.join(objects, junk_obj[:2], junk_obj))
    assert os.path.exists(os.path.join(objects, v1_obj[:2], v1_obj))
    store.mount()
    assert read(store.path("d", "v2")) == bytes(v2)
    store.umount()
    fsck_clean(store)
    # Within the grace period nothing is removed.
    store.mount()
    write(store.path("junk2"), os.urandom(200_000))
    store.wait_idle()
    os.unlink(store.path("junk2"))
    store.umount()
    r = store.cli("gc", store.backing, "--json")
    assert '"removed": 0' in r.stdout


def test_missing_object_is_eio_and_fsck_problem(store):
    store.mount()
    write(store.path("lost"), os.urandom(500_000))
    store.wait_idle()
    obj = os.getxattr(store.path("lost"), "user.ckptfs.object").decode()
    store.umount()
    os.unlink(os.path.join(store.backing, ".ckptfs", "objects", obj[:2], obj))
    r = store.cli("fsck", store.backing, check=False)
    assert r.returncode == 4 and "missing" in r.stdout
    store.mount()
    with pytest.raises(OSError) as e:
        read(store.path("lost"))
    assert e.value.errno == 5  # EIO
