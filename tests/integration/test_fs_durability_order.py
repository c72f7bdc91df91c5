"""The order of a commit's durable steps on the backing disk (DESIGN.md §3,
invariants 1 and 2; fs/STORE.md §1 and §3), seen in the daemon's own system
calls.

The crash tests kill the daemon, which leaves the kernel's page cache
intact: a commit that skipped an fsync, or published an object before it was
durable, would pass them and lose acknowledged data only on a power loss.
These tests trace the daemon with strace while it commits and check the
protocol itself:

- an object is written under a temporary name, fsynced, renamed into
  `objects/ab/`, and that folder fsynced before any manifest names it;
- the staging file is fsynced before a manifest record names it;
- the staging file is removed only after the final record is durable;
- a file created through the mount has its folder fsynced after its first
  durable record (the new entry naming it), once;
- nothing under `objects/` is ever opened for writing (objects are
  immutable once named).

Skipped with the reason when strace is missing or cannot attach (ptrace
not permitted).
"""
import os
import re
import shutil
import signal
import subprocess
import time

import pytest

TRACED = "openat,fsync,fdatasync,rename,renameat,renameat2,unlink,unlinkat"
# A traced line: "TID SECONDS name(args) = result <DURATION>", possibly split
# into "TID SECONDS name(args <unfinished ...>" and "TID SECONDS <... name
# resumed>...) = result <DURATION>" (-ttt: when the call began, in seconds
# since the epoch; -T: how long it took).
LINE = re.compile(r"^(\d+)\s+(\d+\.\d+)\s+(.*)$")
CALL = re.compile(r"^(\w+)\((.*)$")
DURATION = re.compile(r"<(\d+\.\d+)>$")
RESUMED = re.compile(r"^<\.\.\. (\w+) resumed>(.*)$")
WRITE_FLAGS = ("O_WRONLY", "O_RDWR", "O_TRUNC", "O_CREAT")


class Call:
    def __init__(self, name, args, start, started_at):
        self.name, self.args, self.start, self.started_at = name, args, start, started_at
        self.end = self.ended_at = None
        self.result = ""


def parse(trace_text):
    """The traced calls in order, each with the line index (and time) where it
    began and the one where it returned."""
    calls, open_calls = [], {}
    for i, line in enumerate(trace_text.splitlines()):
        m = LINE.match(line)
        if not m:
            continue
        tid, at, rest = m.group(1), float(m.group(2)), m.group(3)
        took = DURATION.search(rest)
        rest = DURATION.sub("", rest).rstrip()
        r = RESUMED.match(rest)
        if r:
            c = open_calls.pop(tid, None)
            if c is not None:
                c.args += r.group(2)
                c.end, c.result = i, r.group(2).rsplit("=", 1)[-1].strip()
                c.ended_at = c.started_at + float(took.group(1)) if took else at
            continue
        cm = CALL.match(rest)
        if not cm:
            continue
        c = Call(cm.group(1), cm.group(2), i, at)
        if rest.endswith("<unfinished ...>"):
            open_calls[tid] = c
        else:
            c.end, c.result = i, rest.rsplit("=", 1)[-1].strip()
            c.ended_at = at + float(took.group(1)) if took else at
        calls.append(c)
    return [c for c in calls if c.end is not None]


def ok(c):
    return c.result.split()[0] == "0" if c.result else False


def fd_path(c):
    """The path strace -y prints for the call's first (fd) argument."""
    m = re.match(r"\d+<([^>]*)>", c.args)
    return m.group(1) if m else None


def paths(c):
    """The call's path arguments, absolute: a name relative to a folder fd
    (the *at calls) joined to the path strace -y prints for that fd."""
    out, folder = [], ""
    for part in re.findall(r'\d+<[^>]*>|AT_FDCWD|"[^"]*"', c.args):
        if part.startswith('"'):
            name = part[1:-1]
            out.append(name if name.startswith("/") else os.path.join(folder, name))
        else:
            folder = "" if part == "AT_FDCWD" else part[part.index("<") + 1:-1]
    return out


class Tracer:
    """strace attached to every thread of the daemon."""

    def __init__(self, pid, out):
        self.out = out
        # -f with -p of the process attaches all its threads, and follows
        # the ones it starts.
        cmd = ["strace", "-f", "-qq", "-y", "-ttt", "-T", "-e", f"trace={TRACED}", "-o", out, "-p", str(pid)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 10
        while not self._attached(pid):
            if self.proc.poll() is not None or time.time() > deadline:
                err = self.proc.stderr.read() if self.proc.poll() is not None else "timed out"
                self.stop()
                pytest.skip(f"strace cannot attach to the daemon: {err.strip()}")
            time.sleep(0.05)

    @staticmethod
    def _attached(pid):
        """Every thread of the daemon traced."""
        def traced(tid):
            try:
                with open(f"/proc/{pid}/task/{tid}/status") as f:
                    return any(line.startswith("TracerPid:") and line.split()[1] != "0" for line in f)
            except FileNotFoundError:  # a thread that ended meanwhile
                return True
        return all(traced(t) for t in os.listdir(f"/proc/{pid}/task"))

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # detaches from the daemon
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        with open(self.out) as f:
            return f.read()


@pytest.fixture
def traced(store, tmp_path, request):
    if shutil.which("strace") is None:
        pytest.skip("strace is not installed")
    store.mount(getattr(request, "param", "").format(tmp=tmp_path))
    tracer = Tracer(store.pid, str(tmp_path / "daemon.strace"))
    try:
        yield store, tracer
    finally:
        tracer.stop()


def commit_steps(calls, backing, name):
    """The calls of the commit of the file `name` (top level of the mount):
    its manifest's syncs, its folder's syncs, the staging file's fsync and
    unlink, and each object's temporary file, fsync, rename and folder
    fsync."""
    backing = os.path.realpath(backing)  # strace -y prints resolved paths
    meta = os.path.join(backing, ".ckptfs")
    manifest = os.path.join(backing, name)
    steps = {"manifest_syncs": [], "entry_syncs": [], "folder_syncs": [], "staging_fsyncs": [], "staging_unlinks": [],
             "objects": {}}
    tmp_fsync = {}
    for c in calls:
        path = fd_path(c)
        if c.name in ("fsync", "fdatasync") and ok(c):
            if path == manifest:
                steps["manifest_syncs"].append(c)
            elif path == os.path.dirname(manifest):
                steps["entry_syncs"].append(c)
                steps["folder_syncs"].append((path, c))
            elif path and not path.startswith(meta) and path.startswith(backing) and os.path.isdir(path):
                steps["folder_syncs"].append((path, c))
            elif path and path.startswith(os.path.join(meta, "staging") + "/"):
                steps["staging_fsyncs"].append(c)
            elif path and path.startswith(os.path.join(meta, "tmp") + "/"):
                tmp_fsync[path] = c
            elif path and os.path.dirname(path) == os.path.join(meta, "objects"):
                for o in steps["objects"].values():
                    if o.get("rename") and os.path.dirname(o["name"]) == path and "dir_fsync" not in o:
                        o["dir_fsync"] = c
        elif c.name in ("rename", "renameat", "renameat2") and ok(c):
            names = paths(c)
            if len(names) == 2 and names[1].startswith(os.path.join(meta, "objects") + "/"):
                src, dst = names
                o = steps["objects"].setdefault(dst, {"name": dst})
                o["rename"] = c
                o["tmp_fsync"] = tmp_fsync.get(src)
        elif c.name in ("unlink", "unlinkat") and ok(c):
            if any(p.startswith(os.path.join(meta, "staging") + "/") for p in paths(c)):
                steps["staging_unlinks"].append(c)
    return steps


def check_objects_never_opened_for_writing(calls):
    seen = 0
    for c in calls:
        names = paths(c)
        if c.name != "openat" or not names or "/.ckptfs/objects/" not in names[0]:
            continue
        seen += 1
        parts = [p.strip() for p in c.args.split(",")]
        flags = parts[2].split("|") if len(parts) > 2 else []
        assert not any(f in WRITE_FLAGS for f in flags), f"an object was opened for writing: openat({c.args}"
    return seen


def check_object_published_durably(o):
    assert o.get("tmp_fsync") is not None, f"object {o['name']} renamed into place without an fsync of its file"
    assert o["tmp_fsync"].end < o["rename"].start, f"object {o['name']}: rename before its fsync returned"
    assert o.get("dir_fsync") is not None, f"objects folder of {o['name']} not fsynced after the rename"
    assert o["rename"].end < o["dir_fsync"].start


def write_fsync_and_trace(store, tracer, name):
    """Writes a new file, fsyncs it, closes it and waits for its commit. The
    traced calls, the file's commit steps, the time fsync returned and the
    bytes written."""
    data = os.urandom(1 << 20)
    fd = os.open(store.path(name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
        fsync_returned = time.time()
    finally:
        os.close(fd)
    store.wait_idle()
    calls = parse(tracer.stop())
    return calls, commit_steps(calls, store.backing, name), fsync_returned, data


def test_close_commits_in_the_documented_order(traced):
    store, tracer = traced
    data = os.urandom(3 << 20)
    with open(store.path("ckpt.bin"), "wb") as f:
        f.write(data)
    store.wait_idle()
    calls = parse(tracer.stop())
    assert calls, "strace recorded nothing"
    steps = commit_steps(calls, store.backing, "ckpt.bin")

    # The object: temporary name, fsync, rename, folder fsync.
    assert steps["objects"], "no object was published for the file"
    for o in steps["objects"].values():
        check_object_published_durably(o)
    assert check_objects_never_opened_for_writing(calls) > 0, "no object path seen in the trace"

    # The staging file: durable before a record names it (the staging
    # record, then the final one: two manifest syncs), removed only after
    # the final record is durable.
    assert steps["staging_fsyncs"], "the staging file was never fsynced"
    syncs = steps["manifest_syncs"]
    assert len(syncs) >= 2, f"expected the staging and the final manifest records synced, got {len(syncs)}"
    assert steps["staging_fsyncs"][0].end < syncs[0].start, "a manifest record named a staging file not yet durable"
    final = syncs[-1]
    for o in steps["objects"].values():
        assert o["dir_fsync"].end < final.start, f"the final record named {o['name']} before it was durable"
    assert steps["staging_unlinks"], "the staging file was not removed after the commit"
    assert final.end < steps["staging_unlinks"][-1].start, "staging removed before the final record was durable"
    # The new file's entry: its folder fsynced after the record.
    assert [c for c in steps["entry_syncs"] if c.start > final.end], \
        "the folder naming a new file was not fsynced after its commit"

    with open(store.path("ckpt.bin"), "rb") as f:
        assert f.read() == data


def test_a_new_entry_is_synced_once(traced):
    """The folder of a new file is fsynced at its first commit, not at every
    later one (a rewrite keeps the entry)."""
    store, tracer = traced
    for i in range(3):
        with open(store.path("again.bin"), "wb") as f:
            f.write(os.urandom(256 << 10))
        store.wait_idle()
    calls = parse(tracer.stop())
    steps = commit_steps(calls, store.backing, "again.bin")
    assert len(steps["manifest_syncs"]) >= 6, "three commits, two records each"
    assert len(steps["entry_syncs"]) == 1, f"folder fsynced {len(steps['entry_syncs'])} times for one new entry"


def test_fsync_makes_the_staging_file_durable_before_its_record(traced):
    """fsync's promise (fs/STORE.md §3): when it returns, the staging file and
    a manifest record naming it are durable, before any commit."""
    store, tracer = traced
    calls, steps, fsync_returned, data = write_fsync_and_trace(store, tracer, "synced.bin")
    staging = [c for c in steps["staging_fsyncs"] if c.ended_at <= fsync_returned]
    records = [c for c in steps["manifest_syncs"] if c.ended_at <= fsync_returned]
    assert staging, "fsync returned before the staging file was fsynced"
    assert records, "fsync returned before a manifest record was durable"
    assert staging[0].end < records[-1].start, "the record was synced before the staging file it names"
    entry = [c for c in steps["entry_syncs"] if c.ended_at <= fsync_returned]
    assert entry and entry[0].start > records[0].end, "fsync returned before the new file's entry was durable"
    for o in steps["objects"].values():
        check_object_published_durably(o)
    check_objects_never_opened_for_writing(calls)
    with open(store.path("synced.bin"), "rb") as f:
        assert f.read() == data


@pytest.mark.parametrize("traced", ["staging={tmp}/node-local"], indirect=True)
def test_fsync_with_node_local_staging_commits_to_the_store_first(traced):
    """With the staging area on the node (a shared store's default), fsync
    returns once the file is committed to the store (fs/STORE.md §3): its
    object published durably, the final record and the new entry synced."""
    store, tracer = traced
    calls, steps, fsync_returned, data = write_fsync_and_trace(store, tracer, "shared.bin")
    assert steps["objects"], "no object was published for the file"
    for o in steps["objects"].values():
        check_object_published_durably(o)
        assert o["dir_fsync"].ended_at <= fsync_returned, "fsync returned before the object was durable"
    records = [c for c in steps["manifest_syncs"] if c.ended_at <= fsync_returned]
    assert records, "fsync returned before a manifest record was durable"
    assert all(o["dir_fsync"].end < records[-1].start for o in steps["objects"].values())
    entry = [c for c in steps["entry_syncs"] if c.ended_at <= fsync_returned]
    assert entry and entry[0].start > records[-1].end, "fsync returned before the new file's entry was durable"
    assert not [c for c in calls if c.name == "openat" and any("/.ckptfs/staging/" in x for x in paths(c))], \
        "node-local staging wrote to the store's staging area"
    with open(store.path("shared.bin"), "rb") as f:
        assert f.read() == data


def test_a_new_folders_entry_is_synced_with_its_first_file(traced):
    """A file in a folder made through the mount (a step folder): after its
    record, its folder is fsynced, then the folder above it (where the new
    folder's own entry is), once."""
    store, tracer = traced
    os.makedirs(store.path("run", "step-1"))
    for name in ("model.pt", "optimizer.pt"):
        with open(store.path("run", "step-1", name), "wb") as f:
            f.write(os.urandom(256 << 10))
    store.wait_idle()
    calls = parse(tracer.stop())
    steps = commit_steps(calls, store.backing, os.path.join("run", "step-1", "model.pt"))
    assert steps["manifest_syncs"], "the file's records were not synced"
    backing = os.path.realpath(store.backing)
    first_record = steps["manifest_syncs"][0].end
    order = [p for p, c in sorted(steps["folder_syncs"], key=lambda pc: pc[1].start) if c.start > first_record]
    step, run = os.path.join(backing, "run", "step-1"), os.path.join(backing, "run")
    assert step in order and run in order and backing in order, f"folders synced after the record: {order}"
    assert order.index(step) < order.index(run) < order.index(backing), f"synced in the order {order}"
    assert order.count(run) == 1 and order.count(backing) == 1, f"new folders synced more than once: {order}"
