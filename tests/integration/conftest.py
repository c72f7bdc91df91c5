"""Fixtures that mount a real ckptfs in a temporary directory.

The binary comes from $CKPTFS_BIN (default build/mount-tools/ckptfs). Every
mount is unmounted in teardown (fusermount3 -u, then -uz as a fallback), even
when the test failed or killed the daemon.
"""
import os
import signal
import subprocess
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CKPTFS = os.environ.get("CKPTFS_BIN", os.path.join(REPO, "build", "mount-tools", "ckptfs"))


def _fuse_usable():
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    try:
        fd = os.open("/dev/fuse", os.O_RDWR)
        os.close(fd)
    except OSError as e:
        return f"/dev/fuse is not usable: {e}"
    if not os.path.exists(CKPTFS):
        return f"ckptfs binary not found at {CKPTFS} (build it or set CKPTFS_BIN)"
    return None


def is_mounted(path):
    path = os.path.realpath(path)
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == path for line in f)


def force_unmount(path):
    if not is_mounted(path):
        return
    subprocess.run(["fusermount3", "-u", path], capture_output=True)
    if is_mounted(path):
        subprocess.run(["fusermount3", "-uz", path], capture_output=True)


class Mount:
    """A ckptfs mount of `backing` on `mnt`."""

    def __init__(self, tmp_path):
        self.backing = str(tmp_path / "backing")
        self.mnt = str(tmp_path / "mnt")
        self.log = str(tmp_path / "ckptfs.log")
        os.makedirs(self.backing, exist_ok=True)
        os.makedirs(self.mnt, exist_ok=True)
        self.pid = None

    def path(self, *parts):
        return os.path.join(self.mnt, *parts)

    def mount(self, opts="", check=True):
        # lossy=off by default: most tests assert bit-exact round trips.
        # Later options win, so opts="lossy=on" turns it back on.
        o = f"log={self.log},loglevel=debug,gc_interval=0,lossy=off" + ("," + opts if opts else "")
        r = subprocess.run([CKPTFS, "mount", self.backing, self.mnt, "-o", o], capture_output=True, text=True)
        if check:
            assert r.returncode == 0, f"mount failed ({r.returncode}): {r.stderr}"
            self.pid = int(os.getxattr(self.mnt, "user.ckptfs.pid"))
        return r

    def umount(self):
        r = subprocess.run([CKPTFS, "umount", self.mnt], capture_output=True, text=True)
        assert r.returncode == 0, f"umount failed: {r.stderr}"
        assert not is_mounted(self.mnt)
        self.pid = None

    def kill9(self):
        """kill -9 the daemon and clean up the dead mount."""
        if self.pid:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.wait_dead()
        force_unmount(self.mnt)
        self.pid = None

    def wait_dead(self, timeout=30):
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:  # a zombie counts as dead (its new parent may reap it late) once
                # its other threads are gone too: until then they hold the
                # daemon's files, including its staging area's lock.
                with open(f"/proc/{self.pid}/stat") as f:
                    zombie = f.read().rsplit(")", 1)[1].split()[0] == "Z"
                if zombie and len(os.listdir(f"/proc/{self.pid}/task")) <= 1:
                    return
            except (FileNotFoundError, ProcessLookupError):
                return
            time.sleep(0.02)
        raise AssertionError(f"daemon {self.pid} did not exit")

    def pending(self):
        return int(os.getxattr(self.mnt, "user.ckptfs.pending"))

    def wait_idle(self, timeout=60):
        deadline = time.time() + timeout
        while self.pending() != 0:
            assert time.time() < deadline, "encodes still pending"
            time.sleep(0.02)

    def cli(self, *args, check=True):
        r = subprocess.run([CKPTFS, *args], capture_output=True, text=True)
        if check:
            assert r.returncode == 0, f"ckptfs {' '.join(args)} -> {r.returncode}: {r.stderr}"
        return r

    def teardown(self):
        force_unmount(self.mnt)


def module_mount(tmp_path_factory, name, opts=""):
    """One mount shared by the tests of a module: `yield from` it in a
    module-scoped fixture."""
    why = _fuse_usable()
    if why:
        pytest.skip(f"FUSE unavailable: {why}")
    m = Mount(tmp_path_factory.mktemp(name))
    m.mount(opts)
    try:
        yield m
    finally:
        m.teardown()


@pytest.fixture
def store(tmp_path):
    """An unmounted Mount object (call .mount() yourself)."""
    why = _fuse_usable()
    if why:
        pytest.skip(f"FUSE unavailable: {why}")
    m = Mount(tmp_path)
    try:
        yield m
    finally:
        m.teardown()


@pytest.fixture
def mnt(store):
    """A mounted ckptfs with default options."""
    store.mount()
    return store


def state(path):
    return os.getxattr(path, "user.ckptfs.state").decode()
