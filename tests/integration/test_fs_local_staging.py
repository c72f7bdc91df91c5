"""Node-local staging (-o staging=DIR, fs/STORE.md §3): the raw bytes of files
being written stay in DIR, the store only ever receives committed objects and
manifests, and fsync commits to the store."""
import json
import os
import subprocess
import threading

import pytest

from conftest import CKPTFS, state


def payload(seed, size=3 << 20):
    return bytes((seed * 31 + i * 7) % 251 for i in range(256)) * (size // 256)


def staging_files(root):
    return sorted(os.path.join(d, n) for d, _, names in os.walk(root) for n in names if n != ".lock")



def test_raw_bytes_stay_in_the_local_directory_and_fsync_commits(store, tmp_path):
    local = str(tmp_path / "local-staging")
    store.mount(f"staging={local}")
    in_store = os.path.join(store.backing, ".ckptfs", "staging")
    data = payload(1)
    with open(store.path("ckpt.bin"), "wb") as f:
        f.write(data)
        f.flush()
        # Being written: the bytes are in the local area, nothing in the store's.
        assert staging_files(local) and not staging_files(in_store)
        os.fsync(f.fileno())
        # fsync returned: committed to the store, although the file is still open.
        assert os.getxattr(store.path("ckpt.bin"), "user.ckptfs.stored_bytes") != b"0"
        man = subprocess.run([CKPTFS, "inspect", os.path.join(store.backing, "ckpt.bin"), "--json"], capture_output=True, text=True)
        assert man.returncode == 0, man.stderr
        assert json.loads(man.stdout)["kind"] in ("blob", "raw")
        f.write(b"tail")  # writes after fsync reach the file too
    store.wait_idle()
    assert state(store.path("ckpt.bin")) == "committed"
    with open(store.path("ckpt.bin"), "rb") as f:
        assert f.read() == data + b"tail"
    assert not staging_files(local)
    store.umount()
    assert not os.listdir(local)  # the area goes at a clean unmount
    r = store.cli("fsck", store.backing, check=False)
    assert r.returncode == 0, r.stdout


def test_kill9_after_fsync_keeps_the_file_and_the_next_mount_clears_the_area(store, tmp_path):
    local = str(tmp_path / "local-staging")
    store.mount(f"staging={local}")
    acked = payload(2)
    with open(store.path("acked.bin"), "wb") as f:
        f.write(acked)
        os.fsync(f.fileno())
    # A second file written and never fsynced nor closed: not acknowledged.
    g = open(store.path("open.bin"), "wb")
    g.write(payload(3))
    g.flush()
    store.kill9()
    try:
        g.close()
    except OSError:
        pass
    assert staging_files(local)  # the dead daemon's raw bytes
    store.mount(f"staging={local}")
    with open(store.path("acked.bin"), "rb") as f:
        assert f.read() == acked
    # Recovery removed the dead area (nothing in it was acknowledged).
    assert not staging_files(local)
    assert len(os.listdir(local)) == 1  # the new daemon's own area
    store.umount()
    r = store.cli("fsck", store.backing, check=False)
    assert r.returncode == 0, r.stdout


def test_fsync_while_another_thread_writes_commits_every_byte_written_before(store, tmp_path):
    local = str(tmp_path / "local-staging")
    store.mount(f"staging={local}")
    chunk = payload(4, 1 << 20)
    with open(store.path("grow.bin"), "wb") as f:
        stop = threading.Event()

        def writer():
            while not stop.is_set():
                f.write(chunk)

        f.write(chunk)
        t = threading.Thread(target=writer)
        t.start()
        try:
            for _ in range(5):
                os.fsync(f.fileno())
        finally:
            stop.set()
            t.join()
        written = f.tell()
    store.wait_idle()
    with open(store.path("grow.bin"), "rb") as f:
        assert f.read() == chunk * (written // len(chunk))
    store.umount()


def test_staging_inside_the_store_is_refused(store):
    r = store.mount(f"staging={store.backing}/local", check=False)
    assert r.returncode != 0
    assert "inside the backing directory" in r.stderr
    r = store.mount("staging=relative/dir", check=False)
    assert r.returncode != 0 and "staging" in r.stderr


def test_auto_keeps_staging_in_the_store_on_a_local_filesystem(store):
    store.mount("staging=auto,loglevel=debug")
    with open(store.log) as f:
        assert "staging in the store (the backing directory is on a local filesystem)" in f.read()
    with open(store.path("x.bin"), "wb") as f:
        f.write(payload(5))
        f.flush()
        assert staging_files(os.path.join(store.backing, ".ckptfs", "staging"))
    store.umount()
