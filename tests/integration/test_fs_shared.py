"""Options and sharing: compress=off, and two daemons on one backing directory."""
import os
import subprocess
import time

from conftest import CKPTFS, force_unmount, state


def read(path):
    with open(path, "rb") as f:
        return f.read()


def test_compress_off_stores_raw_objects(store):
    store.mount("compress=off")
    data = os.urandom(1 << 20)
    with open(store.path("raw.bin"), "wb") as f:
        f.write(data)
    store.wait_idle()
    assert state(store.path("raw.bin")) == "committed"
    assert os.getxattr(store.path("raw.bin"), "user.ckptfs.codec") == b"raw"
    obj = os.getxattr(store.path("raw.bin"), "user.ckptfs.object").decode()
    assert read(os.path.join(store.backing, ".ckptfs", "objects", obj[:2], obj)) == data
    store.umount()
    store.mount()  # a store written with compress=off reads back under any options
    assert read(store.path("raw.bin")) == data
    store.umount()
    r = store.cli("fsck", store.backing, check=False)
    assert r.returncode == 0, r.stdout


def test_two_daemons_share_one_backing(store, tmp_path):
    store.mount()
    second = str(tmp_path / "mnt2")
    os.makedirs(second)
    r = subprocess.run([CKPTFS, "mount", store.backing, second, "-o", f"log={tmp_path}/second.log,gc_interval=0"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    try:
        a, b = os.urandom(700_000), os.urandom(900_000)
        with open(store.path("from_a"), "wb") as f:
            f.write(a)
        with open(os.path.join(second, "from_b"), "wb") as f:
            f.write(b)
        store.wait_idle()
        pid2 = int(os.getxattr(second, "user.ckptfs.pid"))
        while int(os.getxattr(second, "user.ckptfs.pending")) != 0:
            time.sleep(0.02)
        assert read(os.path.join(second, "from_a")) == a
        assert read(store.path("from_b")) == b
        # Each daemon's staging area is its own: two areas while both live.
        areas = os.listdir(os.path.join(store.backing, ".ckptfs", "staging"))
        assert len(areas) == 2
        r = subprocess.run([CKPTFS, "umount", second], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert pid2 > 0
    finally:
        force_unmount(second)
    store.umount()
    r = store.cli("fsck", store.backing, check=False)
    assert r.returncode == 0, r.stdout
    assert os.listdir(os.path.join(store.backing, ".ckptfs", "staging")) == []
