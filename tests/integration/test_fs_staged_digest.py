"""The content digests a commit takes from the writes as they arrived
(fs/staged_digest.h): a byte-identical copy still names the stored blob,
and a file changed any other way than by writing it front to back is
hashed again at commit, so that it is never taken for the content it had
before the change."""
import ctypes
import os

from conftest import CKPTFS  # noqa: F401  (the mount fixtures need the binary)

SIZE = 5 << 20


def counters(m):
    return (int(os.getxattr(m.mnt, "user.ckptfs.digests_from_writes")),
            int(os.getxattr(m.mnt, "user.ckptfs.digests_hashed_at_commit")))


def obj(path):
    return os.getxattr(path, "user.ckptfs.object").decode()


def write_in_order(path, data, piece=1 << 20):
    with open(path, "wb") as f:
        for off in range(0, len(data), piece):
            f.write(data[off:off + piece])


def committed(m, name, data):
    """Waits for the commit, then checks the bytes read back."""
    m.wait_idle()
    with open(m.path(name), "rb") as f:
        assert f.read() == data, f"{name}: bytes differ"
    return obj(m.path(name))


def test_digests_from_writes_and_every_change_that_voids_them(mnt):
    m = mnt
    original = os.urandom(SIZE)
    changed = bytearray(original)
    changed[100] ^= 0xFF
    changed = bytes(changed)

    # Written front to back: the digests come from the writes, and a copy
    # of the same bytes is stored once.
    write_in_order(m.path("a.bin"), original)
    a = committed(m, "a.bin", original)
    assert counters(m) == (1, 0)
    write_in_order(m.path("copy.bin"), original)
    assert committed(m, "copy.bin", original) == a
    assert counters(m) == (2, 0)

    # An overwrite after the whole file was written: hashed at commit, and
    # keyed by what the file holds now, not by what was written first.
    with open(m.path("over.bin"), "wb") as f:
        f.write(original)
        f.seek(100)
        f.write(changed[100:101])
    over = committed(m, "over.bin", changed)
    assert over != a
    assert counters(m) == (2, 1)
    write_in_order(m.path("changed.bin"), changed)
    assert committed(m, "changed.bin", changed) == over  # the overwritten file's key was of its new bytes
    assert counters(m) == (3, 1)

    # Truncated to zero and written again in the same open: the digests
    # start over and follow the new bytes.
    with open(m.path("rewritten.bin"), "wb") as f:
        f.write(changed)
        f.flush()
        os.ftruncate(f.fileno(), 0)
        f.seek(0)
        f.write(original)
    assert committed(m, "rewritten.bin", original) == a
    assert counters(m) == (4, 1)

    # A hole punched into written bytes: hashed at commit.
    holed = bytearray(original)
    holed[1 << 20:2 << 20] = bytes(1 << 20)
    holed = bytes(holed)
    with open(m.path("holed.bin"), "wb") as f:
        f.write(original)
        f.flush()
        libc = ctypes.CDLL(None, use_errno=True)
        FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE = 1, 2
        rc = libc.fallocate(f.fileno(), FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE, ctypes.c_long(1 << 20),
                            ctypes.c_long(1 << 20))
        assert rc == 0, os.strerror(ctypes.get_errno())
    assert committed(m, "holed.bin", holed) != a
    assert counters(m) == (4, 2)

    # Extended by truncate past what was written: hashed at commit.
    with open(m.path("extended.bin"), "wb") as f:
        f.write(original[:SIZE // 2])
        f.flush()
        os.ftruncate(f.fileno(), SIZE)
    assert committed(m, "extended.bin", original[:SIZE // 2] + bytes(SIZE - SIZE // 2)) != a
    assert counters(m) == (4, 3)

    # Appended to after its commit: the staging file starts as a copy of
    # the committed bytes, so it is hashed at commit.
    with open(m.path("a.bin"), "ab") as f:
        f.write(b"tail")
    assert committed(m, "a.bin", original + b"tail") != a
    assert counters(m) == (4, 4)

    # Everything reads back the same after a remount.
    m.umount()
    m.mount()
    for name, data in (("a.bin", original + b"tail"), ("copy.bin", original), ("over.bin", changed),
                       ("changed.bin", changed), ("rewritten.bin", original), ("holed.bin", holed)):
        with open(m.path(name), "rb") as f:
            assert f.read() == data, name


def test_a_mount_that_stores_files_as_they_are_does_not_hash_them(store):
    store.mount("compress=off")
    data = os.urandom(SIZE)
    write_in_order(store.path("a.bin"), data)
    committed(store, "a.bin", data)
    assert counters(store) == (0, 0)
