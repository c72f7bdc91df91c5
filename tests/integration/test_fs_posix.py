"""POSIX behaviour of a real ckptfs mount, driven by shell tools and Python."""
import errno
import hashlib
import os
import subprocess
import threading

import pytest

from conftest import CKPTFS, is_mounted, state


def sh(cmd, cwd=None):
    r = subprocess.run(cmd, shell=True, cwd=cwd, capture_output=True, text=True)
    assert r.returncode == 0, f"{cmd}: {r.stderr}"
    return r.stdout


def digest(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def test_shell_tools_large_and_small(mnt, tmp_path):
    src = tmp_path / "src.bin"
    with open(src, "wb") as f:
        f.write(os.urandom(64 << 20))
    small = tmp_path / "small.txt"
    small.write_text("hello ckptfs\n")
    m = mnt.mnt
    sh(f"cp {src} {m}/big && cp {small} {m}/small")
    sh(f"cmp {src} {m}/big && cmp {small} {m}/small")
    assert sh(f"cat {m}/small") == "hello ckptfs\n"
    sh(f"dd if={src} of={m}/dd.bin bs=1M count=8 status=none && cmp -n {8 << 20} {src} {m}/dd.bin")
    sh(f"mv {m}/big {m}/big.moved && cmp {src} {m}/big.moved")
    assert not os.path.exists(f"{m}/big")
    sh(f"ln {m}/big.moved {m}/big.link && ln -s big.moved {m}/big.sym")
    assert os.stat(f"{m}/big.link").st_ino == os.stat(f"{m}/big.moved").st_ino
    assert os.stat(f"{m}/big.link").st_nlink == 2
    assert os.readlink(f"{m}/big.sym") == "big.moved"
    sh(f"cmp {src} {m}/big.sym")
    sh(f"truncate -s 1000 {m}/big.link")
    assert os.path.getsize(f"{m}/big.moved") == 1000
    sh(f"cmp -n 1000 {src} {m}/big.moved")
    sh(f"truncate -s 5000000 {m}/big.moved")
    with open(f"{m}/big.moved", "rb") as f:
        data = f.read()
    assert len(data) == 5000000 and data[1000:] == bytes(5000000 - 1000)
    sh(f"rm {m}/big.link {m}/big.sym")
    sh(f"touch -d '2001-02-03 04:05:06' {m}/small && chmod 600 {m}/small")
    st = os.stat(f"{m}/small")
    assert st.st_mode & 0o777 == 0o600
    assert int(st.st_mtime) == int(subprocess.check_output(["date", "-d", "2001-02-03 04:05:06", "+%s"]))
    sh(f"touch {m}/empty && test -f {m}/empty && test ! -s {m}/empty")
    mnt.wait_idle()
    # Everything survives a remount.
    mnt.umount()
    mnt.mount()
    sh(f"cmp -n {8 << 20} {src} {m}/dd.bin && cmp {small} {m}/small")
    assert os.stat(f"{m}/small").st_mode & 0o777 == 0o600
    assert os.path.getsize(f"{m}/big.moved") == 5000000
    assert sorted(os.listdir(m)) == ["big.moved", "dd.bin", "empty", "small"]


def test_metadata_dir_is_hidden(mnt):
    assert ".ckptfs" not in os.listdir(mnt.mnt)
    assert not os.path.exists(mnt.path(".ckptfs"))
    with pytest.raises(OSError):
        os.mkdir(mnt.path(".ckptfs"))


def test_sparse_writes_and_holes(mnt):
    p = mnt.path("sparse")
    with open(p, "wb") as f:
        f.seek(10 << 20)
        f.write(b"end")
        f.seek(4096)
        f.write(b"middle")
    mnt.wait_idle()
    with open(p, "rb") as f:
        data = f.read()
    want = bytearray((10 << 20) + 3)
    want[4096:4102] = b"middle"
    want[-3:] = b"end"
    assert data == bytes(want)
    # pwrite into a committed file (materialize) keeps the rest.
    fd = os.open(p, os.O_RDWR)
    os.pwrite(fd, b"XY", 5 << 20)
    os.close(fd)
    want[5 << 20:(5 << 20) + 2] = b"XY"
    with open(p, "rb") as f:
        assert f.read() == bytes(want)


def test_append_and_excl(mnt):
    p = mnt.path("log.txt")
    for i in range(20):
        with open(p, "a") as f:
            f.write(f"line {i}\n")
    with open(p) as f:
        assert f.read() == "".join(f"line {i}\n" for i in range(20))
    with pytest.raises(FileExistsError):
        os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    fd = os.open(p, os.O_WRONLY | os.O_TRUNC)
    os.write(fd, b"new")
    os.close(fd)
    with open(p, "rb") as f:
        assert f.read() == b"new"


def test_concurrent_writers(mnt):
    blobs = {f"w{i}": os.urandom((3 << 20) + i * 777) for i in range(4)}

    def writer(name):
        with open(mnt.path(name), "wb") as f:
            data = blobs[name]
            for at in range(0, len(data), 100_000):
                f.write(data[at:at + 100_000])

    threads = [threading.Thread(target=writer, args=(n,)) for n in blobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for name, data in blobs.items():
        with open(mnt.path(name), "rb") as f:
            assert f.read() == data
    mnt.wait_idle()
    for name, data in blobs.items():
        assert state(mnt.path(name)) == "committed"
        with open(mnt.path(name), "rb") as f:
            assert f.read() == data


def test_two_handles_on_one_file(mnt):
    p = mnt.path("shared")
    a = os.open(p, os.O_CREAT | os.O_RDWR)
    b = os.open(p, os.O_RDWR)
    os.pwrite(a, b"aaaa", 0)
    os.pwrite(b, b"bb", 2)
    assert os.pread(a, 10, 0) == b"aabb"
    os.close(a)
    assert os.pread(b, 10, 0) == b"aabb"
    os.pwrite(b, b"c", 4)
    os.close(b)
    with open(p, "rb") as f:
        assert f.read() == b"aabbc"


def test_close_then_reopen_always_sees_new_bytes(mnt):
    p = mnt.path("loop.bin")
    for i in range(60):
        data = os.urandom(5000 + i * 1000) if i % 2 else bytes([i]) * (200_000 + i)
        with open(p, "wb") as f:
            f.write(data)
        with open(p, "rb") as f:
            assert f.read() == data, f"iteration {i}"
        assert os.path.getsize(p) == len(data)


def test_close_then_reopen_reads_the_daemons_new_bytes(mnt):
    """The same as above with the kernel's cached pages dropped before the
    read, so that the bytes come from the daemon while the new version is
    still being committed (RELEASE is asynchronous: DESIGN.md §3,
    invariant 5), not from the pages the writes left."""
    p = mnt.path("reread.bin")
    with open(p, "wb") as f:
        f.write(os.urandom(8 << 20))
    mnt.wait_idle()
    states = set()
    for i in range(8):
        data = os.urandom((8 << 20) + i * 4096)
        with open(p, "wb") as f:
            f.write(data)
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            states.add(state(p))
            got = bytearray()
            while chunk := os.read(fd, 1 << 20):
                got += chunk
        finally:
            os.close(fd)
        assert bytes(got) == data, f"iteration {i}"
        mnt.wait_idle()
    assert states & {"staging", "encoding"}, f"every read came after the commit: {states}"


def test_hard_links_across_a_remount(store):
    """Both names of a hard link stay one file with the newest bytes after
    the daemon restarts (invariant 5 across a remount)."""
    store.mount()
    f, g = store.path("f"), store.path("g")
    with open(f, "wb") as h:
        h.write(os.urandom(300_000))
    os.link(f, g)
    new = os.urandom(400_000)
    with open(g, "wb") as h:  # through the second name
        h.write(new)
    store.wait_idle()
    store.umount()
    store.mount()
    sf, sg = os.stat(f), os.stat(g)
    assert sf.st_nlink == sg.st_nlink == 2 and sf.st_ino == sg.st_ino
    for name in (f, g):
        with open(name, "rb") as h:
            assert h.read() == new, name
    newer = os.urandom(100_000)
    with open(f, "wb") as h:
        h.write(newer)
    store.wait_idle()
    with open(g, "rb") as h:
        assert h.read() == newer


def test_rename_over_open_file_and_unlink_open(mnt):
    old = os.urandom(300_000)
    new = os.urandom(200_000)
    with open(mnt.path("target"), "wb") as f:
        f.write(old)
    mnt.wait_idle()
    reader = open(mnt.path("target"), "rb")
    with open(mnt.path("target.tmp"), "wb") as f:
        f.write(new)
    os.replace(mnt.path("target.tmp"), mnt.path("target"))
    assert reader.read() == old  # the open file keeps its content
    reader.close()
    with open(mnt.path("target"), "rb") as f:
        assert f.read() == new
    # unlink of an open file in staging and committed states
    w = open(mnt.path("doomed"), "w+b")
    w.write(b"x" * 100_000)
    w.flush()
    os.unlink(mnt.path("doomed"))
    w.seek(0)
    assert w.read() == b"x" * 100_000
    w.close()
    assert not os.path.exists(mnt.path("doomed"))


def test_rename_noreplace(mnt):
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    for n in ("a", "b"):
        with open(mnt.path(n), "w") as f:
            f.write(n)
    AT_FDCWD, RENAME_NOREPLACE = -100, 1
    rc = libc.renameat2(AT_FDCWD, mnt.path("a").encode(), AT_FDCWD, mnt.path("b").encode(), RENAME_NOREPLACE)
    assert rc == -1 and ctypes.get_errno() == errno.EEXIST
    with open(mnt.path("b")) as f:
        assert f.read() == "b"


def test_directories(mnt):
    os.makedirs(mnt.path("d1", "d2"))
    with open(mnt.path("d1", "d2", "f"), "w") as f:
        f.write("deep")
    os.rename(mnt.path("d1"), mnt.path("d3"))
    with open(mnt.path("d3", "d2", "f")) as f:
        assert f.read() == "deep"
    with pytest.raises(OSError) as e:
        os.rmdir(mnt.path("d3"))
    assert e.value.errno == errno.ENOTEMPTY
    names = [f"n{i:04d}" for i in range(500)]
    for n in names:
        open(mnt.path("d3", n), "w").close()
    assert sorted(os.listdir(mnt.path("d3"))) == sorted(names + ["d2"])
    with open(mnt.path("d3", "n0001"), "wb") as f:
        f.write(b"z" * 50_000)
    mnt.wait_idle()
    sizes = {e.name: e.stat().st_size for e in os.scandir(mnt.path("d3")) if e.is_file()}
    assert sizes["n0001"] == 50_000 and sizes["n0002"] == 0  # logical sizes, not manifest sizes
    sh(f"rm -r {mnt.path('d3')}")
    assert not os.path.exists(mnt.path("d3"))
    os.statvfs(mnt.mnt)


def test_xattrs(mnt):
    p = mnt.path("x")
    with open(p, "wb") as f:
        f.write(os.urandom(100_000))
    os.setxattr(p, "user.note", b"hello")
    assert os.getxattr(p, "user.note") == b"hello"
    assert "user.note" in os.listxattr(p)
    mnt.wait_idle()
    assert state(p) == "committed"
    assert int(os.getxattr(p, "user.ckptfs.stored_bytes")) > 0
    assert os.getxattr(p, "user.ckptfs.codec").decode().startswith("blob")
    float(os.getxattr(p, "user.ckptfs.ratio"))
    with pytest.raises(OSError) as e:
        os.setxattr(p, "user.ckptfs.state", b"x")
    assert e.value.errno == errno.EPERM
    # The user's xattr survives a rewrite and a remount (it is on the manifest).
    with open(p, "wb") as f:
        f.write(b"rewritten" * 1000)
    mnt.umount()
    mnt.mount()
    assert os.getxattr(p, "user.note") == b"hello"
    os.removexattr(p, "user.note")
    assert "user.note" not in os.listxattr(p)


def test_plain_backing_files_are_served_verbatim(store):
    data = os.urandom(123_456)
    with open(os.path.join(store.backing, "preexisting.bin"), "wb") as f:
        f.write(data)
    store.mount()
    with open(store.path("preexisting.bin"), "rb") as f:
        assert f.read() == data
    assert state(store.path("preexisting.bin")) == "plain"
    with open(store.path("preexisting.bin"), "ab") as f:  # converted on write
        f.write(b"tail")
    store.wait_idle()
    assert state(store.path("preexisting.bin")) == "committed"
    with open(store.path("preexisting.bin"), "rb") as f:
        assert f.read() == data + b"tail"


def test_mount_errors_have_distinct_exit_codes(store, tmp_path):
    r = store.cli("mount", store.backing, store.backing, check=False)
    assert r.returncode == 1 and "inside" in r.stderr
    inner = os.path.join(store.mnt, "inner")
    os.makedirs(inner)
    r = store.cli("mount", inner, store.mnt, check=False)
    assert r.returncode == 1
    os.makedirs(os.path.join(store.backing, ".ckptfs"))
    with open(os.path.join(store.backing, ".ckptfs", "format"), "w") as f:
        f.write("ckptfs-store 99\n")
    r = store.cli("mount", store.backing, store.mnt, check=False)
    assert r.returncode == 2 and "unknown store format" in r.stderr
    assert not is_mounted(store.mnt)
    r = store.cli("mount", store.backing, store.mnt, "-o", "bogus=1", check=False)
    assert r.returncode == 1


def test_mount_helper_invocation(store, tmp_path):
    helper = tmp_path / "mount.ckptfs"
    os.symlink(CKPTFS, helper)
    r = subprocess.run([str(helper), store.backing, store.mnt, "-o", f"rw,log={store.log}"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert is_mounted(store.mnt)
    with open(store.path("f"), "w") as f:
        f.write("via helper")
    store.pid = int(os.getxattr(store.mnt, "user.ckptfs.pid"))
    store.umount()
