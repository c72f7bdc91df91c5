"""Permissions and the store's trust boundary:
- with default_permissions the kernel enforces POSIX modes for a non-root
  user (`nobody`, via setpriv), with the errno POSIX names;
- other users reach the mount only with allow_other, and allow_other never
  comes without permission checks;
- nothing a manifest says can make the daemon read outside the store, and
  objects replaced by symlinks are refused;
- the store's own files are private to the daemon's user.
"""
import ctypes
import ctypes.util
import errno
import json
import os
import pathlib
import shutil
import stat
import struct
import subprocess
import tempfile

import pytest

from conftest import Mount, _fuse_usable

NOBODY = 65534
PROBE = r"""
import errno, json, os, sys
root = sys.argv[1]
def p(*a): return os.path.join(root, *a)
def attempt(fn):
    try:
        fn()
        return "ok"
    except OSError as e:
        return errno.errorcode[e.errno]
def write_new(path):
    with open(path, "wb") as f:
        f.write(b"mine")
out = {
    "stat_root": attempt(lambda: os.stat(root)),
    "read_0600": attempt(lambda: open(p("secret"), "rb").read()),
    "list_0700_dir": attempt(lambda: os.listdir(p("private"))),
    "read_0644": attempt(lambda: open(p("pub", "ro"), "rb").read()),
    "write_0644": attempt(lambda: open(p("pub", "ro"), "r+b")),
    "truncate_0644": attempt(lambda: os.truncate(p("pub", "ro"), 0)),
    "create_in_0755_dir": attempt(lambda: write_new(p("pub", "new"))),
    "unlink_in_0755_dir": attempt(lambda: os.unlink(p("pub", "ro"))),
    "rename_in_0755_dir": attempt(lambda: os.rename(p("pub", "ro"), p("pub", "ro2"))),
    "mkdir_in_0755_dir": attempt(lambda: os.mkdir(p("pub", "d"))),
    "chmod_not_owner": attempt(lambda: os.chmod(p("pub", "ro"), 0o666)),
    "chown_not_root": attempt(lambda: os.chown(p("pub", "ro"), os.getuid(), -1)),
    "utime_now_no_write": attempt(lambda: os.utime(p("pub", "ro"))),
    "utime_set_not_owner": attempt(lambda: os.utime(p("pub", "ro"), (1, 1))),
    "setxattr_not_owner": attempt(lambda: os.setxattr(p("pub", "ro"), "user.x", b"1")),
    "create_in_sticky": attempt(lambda: write_new(p("sticky", "nobodys"))),
    "unlink_other_in_sticky": attempt(lambda: os.unlink(p("sticky", "roots"))),
    "rename_other_in_sticky": attempt(lambda: os.rename(p("sticky", "roots"), p("sticky", "x"))),
    "unlink_own_in_sticky": attempt(lambda: os.unlink(p("sticky", "nobodys2"))),
    "write_0666": attempt(lambda: open(p("pub", "rw"), "r+b").write(b"z")),
}
try:
    st = os.stat(p("sticky", "nobodys"))
    out["new_file_owner"] = [st.st_uid, st.st_gid]
except OSError:
    pass
print(json.dumps(out))
"""


def as_nobody(root):
    r = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "/usr/bin/python3",
                        "-c", PROBE, root], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.fixture
def pub():
    """A Mount in a directory other users can traverse (pytest's tmp_path
    is private to root)."""
    why = _fuse_usable()
    if why:
        pytest.skip(f"FUSE unavailable: {why}")
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv")
    top = tempfile.mkdtemp(prefix="ckptfs-perms-")
    os.chmod(top, 0o755)
    m = Mount(pathlib.Path(top))
    os.chmod(m.mnt, 0o755)
    try:
        yield m
    finally:
        m.teardown()
        if m.pid:
            m.wait_dead()  # the daemon removes its staging area as it exits
        shutil.rmtree(top, ignore_errors=True)


def populate(m):
    def put(rel, data, mode):
        with open(m.path(rel), "wb") as f:
            f.write(data)
        os.chmod(m.path(rel), mode)
    os.chmod(m.mnt, 0o755)
    put("secret", b"s" * 10_000, 0o600)
    os.mkdir(m.path("private"), 0o700)
    os.mkdir(m.path("pub"), 0o755)
    put("pub/ro", b"r" * 10_000, 0o644)
    put("pub/rw", b"w" * 10_000, 0o666)
    os.mkdir(m.path("sticky"))
    os.chmod(m.path("sticky"), 0o1777)
    put("sticky/roots", b"root", 0o644)
    put("sticky/nobodys2", b"n", 0o644)
    os.chown(m.path("sticky/nobodys2"), NOBODY, NOBODY)


WANT = {
    "stat_root": "ok", "read_0600": "EACCES", "list_0700_dir": "EACCES", "read_0644": "ok",
    "write_0644": "EACCES", "truncate_0644": "EACCES", "create_in_0755_dir": "EACCES",
    "unlink_in_0755_dir": "EACCES", "rename_in_0755_dir": "EACCES", "mkdir_in_0755_dir": "EACCES",
    "chmod_not_owner": "EPERM", "chown_not_root": "EPERM", "utime_now_no_write": "EACCES",
    "utime_set_not_owner": "EPERM", "setxattr_not_owner": "EACCES", "create_in_sticky": "ok",
    "unlink_other_in_sticky": "EPERM", "rename_other_in_sticky": "EPERM", "unlink_own_in_sticky": "ok",
    "write_0666": "ok", "new_file_owner": [NOBODY, NOBODY],
}


@pytest.mark.parametrize("opts", ["allow_other,default_permissions", "allow_other"])
def test_permissions_enforced_for_other_users(pub, opts):
    # allow_other alone must not open root's files to everyone: the daemon
    # runs as root and checks nothing itself, so it adds default_permissions.
    pub.mount(opts)
    populate(pub)
    got = as_nobody(pub.mnt)
    assert got == WANT
    with open(pub.path("pub", "rw"), "rb") as f:
        assert f.read() == b"z" + b"w" * 9_999
    assert not os.path.exists(pub.path("sticky", "nobodys2"))


def test_other_users_cannot_see_the_mount_without_allow_other(pub):
    pub.mount()
    populate(pub)
    got = as_nobody(pub.mnt)
    assert got["stat_root"] == "EACCES" and got["read_0644"] == "EACCES"


# --- the store ---------------------------------------------------------

def xxh3_64(data):
    lib = ctypes.CDLL(ctypes.util.find_library("xxhash") or "libxxhash.so.0")
    lib.XXH3_64bits.restype = ctypes.c_uint64
    lib.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    return lib.XXH3_64bits(data, len(data))


def rewrite_manifest(path, **fields):
    """Writes a new record (sequence + 1) with `fields` changed, following
    the slot format of fs/STORE.md section 2."""
    with open(path, "rb") as f:
        raw = f.read()
    slots = [raw[:4096], raw[4096:8192]]
    recs = []
    for s in slots:
        if len(s) >= 104 and s[:8] == b"CKFSMAN1":
            n = struct.unpack_from("<I", s, 92)[0]
            if struct.unpack_from("<Q", s, 96 + n)[0] == xxh3_64(s[:96 + n]):
                recs.append(bytearray(s[:96 + n]))
    rec = max(recs, key=lambda r: struct.unpack_from("<Q", r, 16)[0])
    seq = struct.unpack_from("<Q", rec, 16)[0] + 1
    struct.pack_into("<Q", rec, 16, seq)
    offsets = {"kind": (10, "<B"), "object": (40, "16s"), "staging": (72, "16s")}
    for key, value in fields.items():
        off, fmt = offsets[key]
        struct.pack_into(fmt, rec, off, value)
    rec += struct.pack("<Q", xxh3_64(bytes(rec)))
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.seek((seq % 2) * 4096)
        f.write(rec)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


@pytest.mark.parametrize("case", ["object_dotdot", "object_missing", "staging_dotdot", "object_symlink"])
def test_manifests_cannot_reach_outside_the_store(store, tmp_path, case):
    outside = tmp_path / "outside"
    outside.write_bytes(b"outside the store " * 1000)
    store.mount()
    data = os.urandom(100_000)
    with open(store.path("f"), "wb") as f:
        f.write(data)
    store.wait_idle()
    obj_hex = os.getxattr(store.path("f"), "user.ckptfs.object").decode()
    store.umount()
    manifest = os.path.join(store.backing, "f")
    if case == "object_dotdot":  # the 16 id bytes spell a relative path
        rewrite_manifest(manifest, object=b"../../../../etc/")
    elif case == "object_missing":
        rewrite_manifest(manifest, object=bytes(range(16)))
    elif case == "staging_dotdot":
        rewrite_manifest(manifest, kind=3, staging=b"/../../../../tmp")
    else:
        obj = os.path.join(store.backing, ".ckptfs", "objects", obj_hex[:2], obj_hex)
        copy = tmp_path / "object_copy"
        shutil.copy(obj, copy)  # the same bytes, but outside: still refused
        os.unlink(obj)
        os.symlink(copy, obj)
    r = store.cli("fsck", store.backing, check=False)
    assert r.returncode == 4, r.stdout + r.stderr
    store.mount()
    with pytest.raises(OSError) as e:
        with open(store.path("f"), "rb") as f:
            f.read()
    assert e.value.errno in (errno.EIO, errno.ENOENT), e.value
    assert outside.read_bytes().startswith(b"outside")  # untouched
    with open(store.log) as f:
        log = f.read()
    assert "error" in log.lower()


def test_store_files_are_private(store):
    os.makedirs(os.path.join(store.backing, ".ckptfs"))  # a store made with a loose mode
    os.chmod(os.path.join(store.backing, ".ckptfs"), 0o755)
    store.mount()
    with open(store.path("big"), "wb") as f:
        f.write(os.urandom(200_000))
    w = open(store.path("open"), "wb")  # keeps a staging file alive
    w.write(os.urandom(100_000))
    w.flush()
    store.wait_idle()
    meta = os.path.join(store.backing, ".ckptfs")
    assert stat.S_IMODE(os.stat(meta).st_mode) == 0o700
    seen = 0
    for dirpath, dirs, files in os.walk(meta):
        if dirpath == meta:
            files = []  # the format file says nothing secret
        for n in dirs + files:
            st = os.lstat(os.path.join(dirpath, n))
            if stat.S_ISLNK(st.st_mode):
                # Content index entries: a symbolic link's mode is always
                # 0777 and never checked; its folder is private.
                assert os.path.basename(dirpath) == "content", os.path.join(dirpath, n)
                continue
            mode = stat.S_IMODE(st.st_mode)
            assert mode & 0o077 == 0, f"{os.path.join(dirpath, n)} is mode {mode:o}"
            seen += 1
    w.close()
    assert seen >= 6
