"""POSIX semantics of a ckptfs mount, in the spirit of the checks of
pjdfstest and xfstests' generic group that apply to a FUSE filesystem:
rename, link counts, unlink while open, truncate, chmod/chown/utimens and
the ctime/mtime they update, O_APPEND, sparse files, mmap coherence.
docs/reliability.md keeps the table of these checks and their results.

One mount serves the whole module (each test works in its own directory);
files are checked both while staging and after their commit (wait_idle),
since the two are served by different code paths.
"""
import ctypes
import errno
import mmap
import os
import stat
import time

import pytest

from conftest import module_mount

libc = ctypes.CDLL(None, use_errno=True)
AT_FDCWD = -100
RENAME_NOREPLACE, RENAME_EXCHANGE = 1, 2


@pytest.fixture(scope="module")
def fsm(tmp_path_factory):
    yield from module_mount(tmp_path_factory, "posix")


@pytest.fixture
def d(fsm, request):
    """A fresh directory on the shared mount, named after the test."""
    path = fsm.path(request.node.name)
    os.mkdir(path)
    return path


def write(path, data, mode="wb"):
    with open(path, mode) as f:
        f.write(data)


def read(path):
    with open(path, "rb") as f:
        return f.read()


def renameat2(a, b, flags):
    rc = libc.renameat2(AT_FDCWD, a.encode(), AT_FDCWD, b.encode(), flags)
    return 0 if rc == 0 else ctypes.get_errno()


def expect_errno(code, fn, *args):
    with pytest.raises(OSError) as e:
        fn(*args)
    assert e.value.errno == code, f"{fn.__name__}{args}: want {errno.errorcode[code]} have {e.value}"


def test_rename_files_and_dirs(fsm, d):
    a, b, sub = os.path.join(d, "a"), os.path.join(d, "b"), os.path.join(d, "sub")
    write(a, b"A" * 10_000)
    write(b, b"B" * 20_000)
    os.mkdir(sub)
    ino_a = os.stat(a).st_ino
    os.rename(a, b)  # over an existing file: atomic replace, the inode moves
    assert not os.path.exists(a) and read(b) == b"A" * 10_000 and os.stat(b).st_ino == ino_a
    os.rename(b, os.path.join(sub, "c"))  # across directories
    assert read(os.path.join(sub, "c")) == b"A" * 10_000
    os.rename(os.path.join(sub, "c"), os.path.join(sub, "c"))  # onto itself: no-op
    assert read(os.path.join(sub, "c")) == b"A" * 10_000
    empty, full = os.path.join(d, "empty"), os.path.join(d, "full")
    os.mkdir(empty)
    os.mkdir(full)
    write(os.path.join(full, "x"), b"x")
    os.rename(full, empty)  # a directory over an empty directory
    assert os.listdir(empty) == ["x"] and not os.path.exists(full)
    os.mkdir(full)
    expect_errno(errno.ENOTEMPTY, os.rename, full, empty)  # over a non-empty one
    expect_errno(errno.EISDIR, os.rename, os.path.join(sub, "c"), full)  # file over dir
    expect_errno(errno.ENOTDIR, os.rename, full, os.path.join(sub, "c"))  # dir over file
    expect_errno(errno.EINVAL, os.rename, d, os.path.join(d, "sub", "inside"))  # into itself
    expect_errno(errno.ENOENT, os.rename, os.path.join(d, "missing"), os.path.join(d, "y"))
    fsm.wait_idle()
    assert read(os.path.join(sub, "c")) == b"A" * 10_000


def test_rename_noreplace_and_exchange(fsm, d):
    a, b, c = (os.path.join(d, n) for n in "abc")
    write(a, b"a" * 5000)
    write(b, b"b" * 7000)
    assert renameat2(a, b, RENAME_NOREPLACE) == errno.EEXIST
    assert renameat2(a, c, RENAME_NOREPLACE) == 0 and read(c) == b"a" * 5000
    rc = renameat2(c, b, RENAME_EXCHANGE)
    assert rc in (0, errno.EINVAL, errno.ENOTSUP), errno.errorcode.get(rc)
    if rc == 0:  # supported: both names exist with swapped contents
        assert read(b) == b"a" * 5000 and read(c) == b"b" * 7000
        fsm.wait_idle()
        write(b, b"new b" * 1000)  # the exchanged files still commit under their new names
        fsm.wait_idle()
        assert read(b) == b"new b" * 1000 and read(c) == b"b" * 7000


def test_link_counts(fsm, d):
    f, g = os.path.join(d, "f"), os.path.join(d, "g")
    write(f, b"linked" * 1000)
    assert os.stat(f).st_nlink == 1
    os.link(f, g)
    assert os.stat(f).st_nlink == 2 and os.stat(f).st_ino == os.stat(g).st_ino
    write(g, b"through the other name" * 500)  # one inode: both names see it
    assert read(f) == b"through the other name" * 500
    fsm.wait_idle()
    assert read(f) == b"through the other name" * 500
    os.unlink(f)
    assert os.stat(g).st_nlink == 1
    expect_errno(errno.EEXIST, os.link, g, g)
    base = os.stat(d).st_nlink
    os.mkdir(os.path.join(d, "s1"))
    os.mkdir(os.path.join(d, "s2"))
    assert os.stat(d).st_nlink == base + 2  # each subdirectory's ".." links the parent
    os.rmdir(os.path.join(d, "s2"))
    assert os.stat(d).st_nlink == base + 1
    expect_errno(errno.EPERM, os.link, os.path.join(d, "s1"), os.path.join(d, "s3"))  # no dir hard links


@pytest.mark.parametrize("committed", [False, True])
def test_unlink_while_open(fsm, d, committed):
    p = os.path.join(d, "f")
    data = os.urandom(300_000)
    write(p, data)
    if committed:
        fsm.wait_idle()
    fd = os.open(p, os.O_RDWR)
    os.unlink(p)
    assert not os.path.exists(p)
    assert os.fstat(fd).st_nlink == 0
    assert os.pread(fd, len(data), 0) == data
    os.pwrite(fd, b"still writable", 10)
    assert os.pread(fd, 14, 10) == b"still writable"
    os.close(fd)
    fsm.wait_idle()
    assert os.listdir(d) == []


def test_truncate_down_and_up(fsm, d):
    p = os.path.join(d, "t")
    data = os.urandom(200_000)
    write(p, data)
    fsm.wait_idle()
    os.truncate(p, 50_000)  # truncate(2) on a committed file, no open handle
    assert os.stat(p).st_size == 50_000 and read(p) == data[:50_000]
    os.truncate(p, 120_000)  # extending reads zeros, never the old bytes
    assert read(p) == data[:50_000] + bytes(70_000)
    with open(p, "r+b") as f:
        f.truncate(10)
        f.seek(0, os.SEEK_END)
        assert f.tell() == 10
        f.truncate(4096)
        f.seek(4000)
        f.write(b"tail")
    fsm.wait_idle()
    assert read(p) == data[:10] + bytes(3990) + b"tail" + bytes(92)
    os.truncate(p, 0)
    fsm.wait_idle()
    assert os.stat(p).st_size == 0 and read(p) == b""
    expect_errno(errno.EISDIR, os.truncate, d, 0)


def test_chmod_chown_utimens_and_ctime(fsm, d):
    p = os.path.join(d, "f")
    write(p, b"x" * 10_000)
    fsm.wait_idle()
    time.sleep(0.02)
    before = os.stat(p)
    os.chmod(p, 0o640)
    st = os.stat(p)
    assert stat.S_IMODE(st.st_mode) == 0o640
    assert st.st_ctime_ns > before.st_ctime_ns, "chmod updates ctime"
    assert st.st_mtime_ns == before.st_mtime_ns, "chmod leaves mtime"
    os.chown(p, 1234, 5678)
    st2 = os.stat(p)
    assert (st2.st_uid, st2.st_gid) == (1234, 5678) and st2.st_ctime_ns >= st.st_ctime_ns
    os.utime(p, ns=(1_000_000_000_123, 2_000_000_000_456))
    st3 = os.stat(p)
    assert st3.st_atime_ns == 1_000_000_000_123 and st3.st_mtime_ns == 2_000_000_000_456
    assert st3.st_ctime_ns >= st2.st_ctime_ns
    time.sleep(0.02)
    with open(p, "r+b") as f:  # a write updates mtime and ctime
        f.write(b"y")
    st4 = os.stat(p)
    assert st4.st_mtime_ns > st3.st_mtime_ns and st4.st_ctime_ns > st3.st_ctime_ns
    fsm.wait_idle()
    st5 = os.stat(p)
    assert st5.st_mtime_ns >= st4.st_mtime_ns and st5.st_ctime_ns >= st4.st_mtime_ns
    fsm.umount()  # everything above survives a remount
    fsm.mount()
    st6 = os.stat(p)
    assert (stat.S_IMODE(st6.st_mode), st6.st_uid, st6.st_gid) == (0o640, 1234, 5678)
    assert st6.st_mtime_ns == st5.st_mtime_ns
    before_dir = os.stat(d)
    time.sleep(0.02)
    write(os.path.join(d, "new"), b"")  # create and unlink update the directory's mtime/ctime
    after_create = os.stat(d)
    assert after_create.st_mtime_ns > before_dir.st_mtime_ns and after_create.st_ctime_ns > before_dir.st_ctime_ns
    time.sleep(0.02)
    os.unlink(os.path.join(d, "new"))
    assert os.stat(d).st_mtime_ns > after_create.st_mtime_ns


def test_setgid_directory_group_inheritance(fsm, d):
    sg = os.path.join(d, "sg")
    os.mkdir(sg)
    os.chown(sg, -1, 4321)
    os.chmod(sg, 0o2775)
    write(os.path.join(sg, "f"), b"x" * 5000)
    os.mkdir(os.path.join(sg, "sub"))
    assert os.stat(os.path.join(sg, "f")).st_gid == 4321, "a new file takes the set-group-ID directory's group"
    st = os.stat(os.path.join(sg, "sub"))
    assert st.st_gid == 4321 and st.st_mode & stat.S_ISGID, "a new subdirectory inherits group and the bit"


def test_o_append(fsm, d):
    p = os.path.join(d, "log")
    write(p, b"0" * 5000)
    fsm.wait_idle()
    a = os.open(p, os.O_WRONLY | os.O_APPEND)
    b = os.open(p, os.O_WRONLY | os.O_APPEND)
    os.lseek(a, 0, os.SEEK_SET)  # O_APPEND ignores the offset
    os.write(a, b"A" * 100)
    os.write(b, b"B" * 100)
    os.write(a, b"C" * 100)
    os.close(a)
    os.close(b)
    want = b"0" * 5000 + b"A" * 100 + b"B" * 100 + b"C" * 100
    assert read(p) == want
    fsm.wait_idle()
    assert read(p) == want


def test_sparse_file(fsm, d):
    p = os.path.join(d, "sparse")
    with open(p, "wb") as f:
        f.seek(64 << 20)
        f.write(b"end")
        f.seek(1 << 20)
        f.write(b"middle")
    want_size = (64 << 20) + 3
    assert os.stat(p).st_size == want_size
    fsm.wait_idle()
    with open(p, "rb") as f:
        f.seek((1 << 20) - 10)
        assert f.read(20) == bytes(10) + b"middle" + bytes(4)
        f.seek(64 << 20)
        assert f.read() == b"end"
    assert os.stat(p).st_blocks * 512 < (8 << 20), "a mostly-zero file is stored small"


def test_mmap_coherence(fsm, d):
    p = os.path.join(d, "m")
    write(p, bytes(64 * 1024))
    fsm.wait_idle()
    fd = os.open(p, os.O_RDWR)
    m = mmap.mmap(fd, 64 * 1024, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    m[100:110] = b"via mmap!!"  # MAP_SHARED store, then read() through another fd
    m.flush()
    with open(p, "rb") as f:
        f.seek(100)
        assert f.read(10) == b"via mmap!!"
    os.pwrite(fd, b"via write", 5000)  # write(), then the existing mapping sees it
    assert m[5000:5009] == b"via write"
    m.close()
    os.close(fd)
    fsm.wait_idle()
    data = read(p)
    assert data[100:110] == b"via mmap!!" and data[5000:5009] == b"via write"
    with open(p, "rb") as f:  # read-only private mapping of a committed file
        rm = mmap.mmap(f.fileno(), 0, mmap.MAP_PRIVATE, mmap.PROT_READ)
        assert rm[:] == data
        rm.close()


def test_namespace_errors(fsm, d):
    f = os.path.join(d, "f")
    write(f, b"f")
    expect_errno(errno.EEXIST, os.mkdir, f)
    expect_errno(errno.EEXIST, os.open, f, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    expect_errno(errno.ENOTDIR, os.rmdir, f)
    expect_errno(errno.ENOTDIR, os.open, os.path.join(f, "x"), os.O_RDONLY)
    expect_errno(errno.EISDIR, os.unlink, d)
    expect_errno(errno.EISDIR, os.open, d, os.O_WRONLY)
    os.symlink("f", os.path.join(d, "ln"))
    assert os.readlink(os.path.join(d, "ln")) == "f" and read(os.path.join(d, "ln")) == b"f"
    expect_errno(errno.ELOOP, os.open, os.path.join(d, "ln"), os.O_RDONLY | os.O_NOFOLLOW)
    os.symlink("ln2", os.path.join(d, "ln2"))  # a loop
    expect_errno(errno.ELOOP, os.stat, os.path.join(d, "ln2"))
