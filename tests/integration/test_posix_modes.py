"""Modes, owners, set-ID bits and times of new and written entries, as ext4
gives them (issue #26).

The mount runs as root with `allow_other,default_permissions,suid,dev`, and
its daemon starts under umask 077, so that a daemon that applied its own
umask would show. Every scenario runs twice, as the same process state
(root, or an unprivileged user with its own supplementary groups, forked
with setgroups/setgid/setuid, under a given umask): once in a directory of
the mount and once in a plain directory of the local file system (/tmp,
ext4 on the development machine), and the two results must be equal. The
expected values are also written out, so that a difference of the local
file system shows as such.
"""
import errno
import json
import os
import pathlib
import shutil
import stat
import tempfile

import pytest

from conftest import Mount, _fuse_usable, state

USER_UID, USER_GID = 60001, 60001
USER_GROUPS = [60001, 60002, 60003]  # 60002: a group the user is in; 4321: one it is not in
MEMBER_GID, OTHER_GID = 60002, 4321
OPTS = "allow_other,default_permissions,suid,dev"


def attempt(fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
        return "ok"
    except OSError as e:
        return errno.errorcode[e.errno]


def run_as(fn, *args, user=False, umask=0o022):
    """fn(*args) in a forked child under `umask`, as root or (user=True) as
    USER_UID with USER_GROUPS; returns its JSON-able result."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.close(r)
            os.umask(umask)
            if user:
                os.setgroups(USER_GROUPS)
                os.setgid(USER_GID)
                os.setuid(USER_UID)
            data = json.dumps({"result": fn(*args)})
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            data = json.dumps({"error": repr(e)})
        with os.fdopen(w, "w") as f:
            f.write(data)
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        data = f.read()
    os.waitpid(pid, 0)
    out = json.loads(data)
    assert "error" not in out, out
    return out["result"]


def describe(path):
    """(mode in octal, uid, gid) of `path` itself, or the errno name."""
    try:
        st = os.lstat(path)
    except OSError as e:
        return errno.errorcode[e.errno]
    return [oct(stat.S_IMODE(st.st_mode)), st.st_uid, st.st_gid]


def tree(root):
    """describe() of every entry under root, by relative path."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            out[os.path.relpath(p, root)] = describe(p)
    return out


@pytest.fixture(scope="module")
def fsm():
    why = _fuse_usable()
    if why:
        pytest.skip(f"FUSE unavailable: {why}")
    if os.geteuid() != 0:
        pytest.skip("needs root (other users, chown, set-ID bits)")
    top = tempfile.mkdtemp(prefix="ckptfs-modes-")
    os.chmod(top, 0o755)  # other users must reach the mount and the local twin
    m = Mount(pathlib.Path(top))
    m.local = os.path.join(top, "local")
    os.mkdir(m.local, 0o755)
    old = os.umask(0o077)
    try:
        m.mount(OPTS)
    finally:
        os.umask(old)
    os.chmod(m.mnt, 0o755)
    try:
        yield m
    finally:
        m.teardown()
        if m.pid:
            m.wait_dead()
        shutil.rmtree(top, ignore_errors=True)


def remount(m):
    m.umount()
    old = os.umask(0o077)
    try:
        m.mount(OPTS)
    finally:
        os.umask(old)


@pytest.fixture
def roots(fsm, request):
    """A fresh 0777 directory named after the test on the mount and on the
    local file system: (mount dir, local dir)."""
    name = request.node.name.replace("[", "_").replace("]", "")
    out = []
    for base in (fsm.mnt, fsm.local):
        p = os.path.join(base, name)
        os.mkdir(p)
        os.chmod(p, 0o777)
        out.append(p)
    return out


def both(roots, fn, *args, **kwargs):
    """fn run on the mount and on the local directory; asserts they agree."""
    got, want = (run_as(fn, r, *args, **kwargs) for r in roots)
    assert got == want, f"mount differs from the local file system:\n mount {got}\n local {want}"
    return got


# --- creation -------------------------------------------------------------

FILE_MODES = [0o622, 0o666, 0o777, 0o4777, 0o2777, 0o6777, 0o1777, 0o640]


def create_everything(root, as_root):
    res = {}
    for mode in FILE_MODES:
        fd = os.open(os.path.join(root, f"open_{mode:o}"), os.O_CREAT | os.O_WRONLY | os.O_EXCL, mode)
        os.close(fd)
    res["mknod_reg"] = attempt(os.mknod, os.path.join(root, "mknod_reg"), stat.S_IFREG | 0o666)
    for mode in (0o777, 0o755, 0o1777, 0o2777):
        os.mkdir(os.path.join(root, f"dir_{mode:o}"), mode)
    os.mkfifo(os.path.join(root, "fifo"), 0o666)
    os.symlink("target", os.path.join(root, "link"))
    if as_root:  # dev: a character device like /dev/null
        os.mknod(os.path.join(root, "null"), stat.S_IFCHR | 0o666, os.makedev(1, 3))
    res["tree"] = tree(root)
    return res


@pytest.mark.parametrize("user", [False, True], ids=["root", "user"])
@pytest.mark.parametrize("umask", [0o000, 0o002, 0o022])
def test_new_entries_get_the_requested_mode_less_the_callers_umask(fsm, roots, umask, user):
    got = both(roots, create_everything, not user, user=user, umask=umask)
    t = got["tree"]
    uid, gid = (USER_UID, USER_GID) if user else (0, 0)
    for mode in FILE_MODES:
        assert t[f"open_{mode:o}"] == [oct(mode & ~umask), uid, gid]
    for mode in (0o777, 0o755, 0o1777, 0o2777):  # mkdir(2) ignores S_ISGID in the mode
        assert t[f"dir_{mode:o}"] == [oct(mode & 0o1777 & ~umask), uid, gid]
    assert t["fifo"] == [oct(0o666 & ~umask), uid, gid]
    assert t["link"] == [oct(0o777), uid, gid]
    assert t["mknod_reg"] == [oct(0o666 & ~umask), uid, gid]
    if not user:
        assert t["null"] == [oct(0o666 & ~umask), 0, 0]
    mnt = roots[0]
    # Staging (written, open), committed, and across a remount: same modes.
    with open(os.path.join(mnt, "open_666"), "wb") as f:
        f.write(b"x" * 100_000)
        assert state(os.path.join(mnt, "open_666")) == "staging"
        assert tree(mnt) == t
    fsm.wait_idle()
    assert state(os.path.join(mnt, "open_666")) == "committed"
    assert tree(mnt) == t
    remount(fsm)
    assert tree(mnt) == t


def write_file_in_setgid_dirs(root):
    res = {}
    for d in ("member", "other"):
        base = os.path.join(root, d)
        fd = os.open(os.path.join(base, "f2777"), os.O_CREAT | os.O_WRONLY, 0o2777)
        os.close(fd)
        fd = os.open(os.path.join(base, "f2767"), os.O_CREAT | os.O_WRONLY, 0o2767)
        os.close(fd)
        os.mkdir(os.path.join(base, "sub"), 0o777)
        os.mkfifo(os.path.join(base, "fifo"), 0o666)
        os.symlink("x", os.path.join(base, "link"))
        os.mkdir(os.path.join(base, "sub", "deeper"), 0o755)
    res["tree"] = tree(root)
    return res


def test_setgid_directories_give_group_and_bit_to_new_entries(fsm, roots):
    for r in roots:
        for d, gid in (("member", MEMBER_GID), ("other", OTHER_GID)):
            os.mkdir(os.path.join(r, d))
            os.chown(os.path.join(r, d), 0, gid)
            os.chmod(os.path.join(r, d), 0o2777)
    t = both(roots, write_file_in_setgid_dirs, user=True, umask=0)["tree"]
    u = USER_UID
    assert t["member/f2777"] == [oct(0o2777), u, MEMBER_GID]
    # Not in the directory's group: a new file loses S_ISGID (with group exec).
    assert t["other/f2777"] == [oct(0o777), u, OTHER_GID]
    assert t["other/f2767"] == [oct(0o2767), u, OTHER_GID]
    for d, gid in (("member", MEMBER_GID), ("other", OTHER_GID)):
        assert t[f"{d}/sub"] == [oct(0o2777), u, gid]
        assert t[f"{d}/sub/deeper"] == [oct(0o2755), u, gid]
        assert t[f"{d}/fifo"] == [oct(0o666), u, gid]
        assert t[f"{d}/link"] == [oct(0o777), u, gid]
    remount(fsm)
    assert tree(roots[0]) == t


# --- set-ID bits on write -------------------------------------------------

SETID_MODES = [0o4777, 0o2777, 0o6777, 0o2767, 0o4666]


def write_each(root, names, how):
    out = {}
    for name in names:
        p = os.path.join(root, name)
        if how == "write":
            try:
                with open(p, "r+b") as f:
                    f.write(b"other")
                out[name] = describe(p)
            except OSError as e:
                out[name] = errno.errorcode[e.errno]
        elif how == "otrunc":
            r = attempt(lambda: os.close(os.open(p, os.O_WRONLY | os.O_TRUNC)))
            out[name] = describe(p) if r == "ok" else r
        else:
            r = attempt(os.truncate, p, 3)
            out[name] = describe(p) if r == "ok" else r
    return out


def make_setid_files(root):
    names = []
    for mode in SETID_MODES:
        name = f"f{mode:o}"
        fd = os.open(os.path.join(root, name), os.O_CREAT | os.O_WRONLY, mode)
        os.write(fd, b"owner's bytes " * 1000)
        os.close(fd)
        names.append(name)
    # S_ISGID without group exec: kept for a writer in the file's group.
    fd = os.open(os.path.join(root, "g2767"), os.O_CREAT | os.O_WRONLY, 0o2767)
    os.write(fd, b"group's bytes")
    os.close(fd)
    os.chown(os.path.join(root, "g2767"), -1, MEMBER_GID)
    os.chmod(os.path.join(root, "g2767"), 0o2767)
    return names + ["g2767"]


@pytest.mark.parametrize("how", ["write", "truncate", "otrunc"])
@pytest.mark.parametrize("phase", ["committed", "staging"])
def test_a_non_owner_write_clears_set_id_bits(fsm, roots, how, phase):
    names = [run_as(make_setid_files, r, umask=0) for r in roots][0]
    fsm.wait_idle()
    holders = []
    if phase == "staging":  # the owner keeps a writer open: the file stays in staging
        holders = [open(os.path.join(roots[0], n), "r+b") for n in names]
        holders[0].write(b"O")
        holders[0].flush()
        assert state(os.path.join(roots[0], names[0])) == "staging"
    try:
        got = both(roots, write_each, names, how, user=True)
    finally:
        for h in holders:
            h.close()
    # S_ISGID without group exec goes too when the writer is not in the
    # file's group (kernel 6.x; FUSE's own conversion keeps it).
    want = {"f4777": [0o777, 0], "f2777": [0o777, 0], "f6777": [0o777, 0], "f2767": [0o767, 0],
            "f4666": [0o666, 0], "g2767": [0o2767, MEMBER_GID]}
    for name, (mode, gid) in want.items():
        assert got[name] == [oct(mode), 0, gid], name
    fsm.wait_idle()
    remount(fsm)
    assert {n: describe(os.path.join(roots[0], n)) for n in names} == got
    with open(os.path.join(roots[0], "f4777"), "rb") as f:
        data = f.read()
    assert data[:5] == b"other" if how == "write" else len(data) == (3 if how == "truncate" else 0)


def root_writes(root, names):
    for name in names:
        with open(os.path.join(root, name), "r+b") as f:
            f.write(b"root")
    return {n: describe(os.path.join(root, n)) for n in names}


def test_an_owner_with_cap_fsetid_keeps_set_id_bits(fsm, roots):
    names = [run_as(make_setid_files, r, umask=0) for r in roots][0]
    got = both(roots, root_writes, names)
    assert got == {**{f"f{m:o}": [oct(m), 0, 0] for m in SETID_MODES}, "g2767": [oct(0o2767), 0, MEMBER_GID]}


# --- rename by a non-owner ------------------------------------------------

def renames(root):
    def p(*a):
        return os.path.join(root, *a)
    return {
        "file_within": attempt(os.rename, p("a", "f"), p("a", "g")),
        "file_between": attempt(os.rename, p("a", "g"), p("b", "g")),
        "file_over_file": attempt(os.rename, p("b", "g"), p("b", "h")),
        "dir_within": attempt(os.rename, p("a", "sub"), p("a", "sub2")),
        # The directory's '..' changes: that needs write permission on it.
        "unwritable_dir_between": attempt(os.rename, p("a", "sub2"), p("b", "sub")),
        "own_dir_between": attempt(os.rename, p("a", "mine"), p("b", "mine")),
        "own_0555_dir_between": attempt(os.rename, p("a", "mine555"), p("b", "mine555")),
        "tree": tree(root),
    }


def test_a_non_owner_renames_in_0777_directories(fsm, roots):
    for r in roots:
        run_as(lambda r: [os.mkdir(os.path.join(r, d), 0o777) for d in ("a", "b")], r, umask=0)
        for name in ("f", "h"):
            with open(os.path.join(r, "a" if name == "f" else "b", name), "wb") as f:
                f.write(b"root's")
        os.mkdir(os.path.join(r, "a", "sub"), 0o755)
        run_as(lambda r: [os.mkdir(os.path.join(r, "a", "mine"), 0o755),
                          os.mkdir(os.path.join(r, "a", "mine555"), 0o555)], r, user=True)
    got = both(roots, renames, user=True)
    assert {k: v for k, v in got.items() if k != "tree"} == {
        "file_within": "ok", "file_between": "ok", "file_over_file": "ok", "dir_within": "ok",
        "unwritable_dir_between": "EACCES", "own_dir_between": "ok", "own_0555_dir_between": "EACCES"}
    assert got["tree"]["b/h"] == [oct(0o644), 0, 0]


# --- times ----------------------------------------------------------------

A, M = 1_000_000_000_123_456_789, 1_100_000_000_987_654_321


def set_times(root, names, follow):
    out = {}
    for name in names:
        p = os.path.join(root, name)
        before = os.lstat(p).st_ctime_ns
        os.utime(p, ns=(A + len(name), M + len(name)), follow_symlinks=follow)
        st = os.lstat(p)
        out[name] = [st.st_atime_ns, st.st_mtime_ns, st.st_ctime_ns >= before]
    return out


def make_typed_entries(root):
    with open(os.path.join(root, "file"), "wb") as f:
        f.write(b"t" * 50_000)
    with open(os.path.join(root, "target"), "wb") as f:
        f.write(b"target")
    os.mkdir(os.path.join(root, "dir"))
    os.mkfifo(os.path.join(root, "fifo"))
    os.symlink("target", os.path.join(root, "link"))
    os.symlink("nowhere", os.path.join(root, "dangling"))
    os.mknod(os.path.join(root, "null"), stat.S_IFCHR | 0o666, os.makedev(1, 3))
    return True


def test_times_of_every_file_type_and_of_symlinks_themselves(fsm, roots):
    for r in roots:
        run_as(make_typed_entries, r)
    fsm.wait_idle()
    names = ["file", "dir", "fifo", "link", "dangling", "null"]
    got = both(roots, set_times, names, False)
    for name in names:
        assert got[name] == [A + len(name), M + len(name), True], name
    target = os.lstat(os.path.join(roots[0], "target"))
    assert (target.st_atime_ns, target.st_mtime_ns) != (A + 4, M + 4), "the link's times, not its target's"
    # Following the link sets the target's times and leaves the link's.
    def follow(r):
        os.utime(os.path.join(r, "link"), ns=(A + 99, M + 99))
        return [os.lstat(os.path.join(r, n)).st_mtime_ns for n in ("link", "target")]
    assert both(roots, follow) == [M + 4, M + 99]
    # A file in staging, then committed; then all of it across a remount.
    p = os.path.join(roots[0], "file")
    with open(p, "r+b", buffering=0) as f:
        f.write(b"w")
        os.utime(p, ns=(A, M))
        assert state(p) == "staging" and (os.stat(p).st_atime_ns, os.stat(p).st_mtime_ns) == (A, M)
    fsm.wait_idle()
    assert (os.stat(p).st_atime_ns, os.stat(p).st_mtime_ns) == (A, M)
    before = {n: os.lstat(os.path.join(roots[0], n)) for n in names}
    remount(fsm)
    for n in names:
        st = os.lstat(os.path.join(roots[0], n))
        assert (st.st_atime_ns, st.st_mtime_ns) == (before[n].st_atime_ns, before[n].st_mtime_ns), n


def new_entry_times(root):
    out = {}
    with open(os.path.join(root, "f"), "wb"):
        pass
    os.mkdir(os.path.join(root, "d"))
    os.mkfifo(os.path.join(root, "p"))
    os.symlink("f", os.path.join(root, "l"))
    for n in ("d", "p", "l"):
        st = os.lstat(os.path.join(root, n))
        out[n] = st.st_atime_ns == st.st_mtime_ns == st.st_ctime_ns
    return out


def test_a_new_entry_has_one_timestamp(fsm, roots):
    assert both(roots, new_entry_times, user=True) == {"d": True, "p": True, "l": True}


# --- name and path lengths -------------------------------------------------

def long_names(root):
    def p(n):
        return os.path.join(root, n)
    ok, long = "n" * 255, "n" * 256
    out = {
        "create_255": attempt(lambda: os.close(os.open(p(ok), os.O_CREAT | os.O_WRONLY, 0o644))),
        "create_256": attempt(lambda: os.close(os.open(p(long), os.O_CREAT | os.O_WRONLY, 0o644))),
        "stat_256": attempt(os.stat, p(long)),
        "mkdir_255": attempt(os.mkdir, p("d" * 255)),
        "mkdir_256": attempt(os.mkdir, p("d" * 256)),
        "mkfifo_256": attempt(os.mkfifo, p("p" * 256)),
        "symlink_256": attempt(os.symlink, "x", p("l" * 256)),
        "link_256": attempt(os.link, p(ok), p("h" * 256)),
        "rename_256": attempt(os.rename, p(ok), p("r" * 256)),
        "symlink_target_4095": attempt(os.symlink, "t" * 4095, p("long_target")),
        "symlink_target_4096": attempt(os.symlink, "t" * 4096, p("too_long_target")),
        "path_4096": attempt(os.stat, os.path.join(root, *(["x" * 200] * 21))),
    }
    out["readlink_4095"] = len(os.readlink(p("long_target")))
    return out


def test_name_and_path_limits_are_ext4s(fsm, roots):
    got = both(roots, long_names, user=True)
    assert got == {
        "create_255": "ok", "create_256": "ENAMETOOLONG", "stat_256": "ENAMETOOLONG", "mkdir_255": "ok",
        "mkdir_256": "ENAMETOOLONG", "mkfifo_256": "ENAMETOOLONG", "symlink_256": "ENAMETOOLONG",
        "link_256": "ENAMETOOLONG", "rename_256": "ENAMETOOLONG", "symlink_target_4095": "ok",
        "symlink_target_4096": "ENAMETOOLONG", "path_4096": "ENAMETOOLONG", "readlink_4095": 4095}
