#!/usr/bin/python3
"""Crash-consistency harness for ckptfs.

Each iteration (its own seed, its own fresh store):
  1. mounts BACKING with a policy file that stores `lossy/` lossily (rel_l2
     budget) and `exact/` bit-exact;
  2. starts a writer process whose threads write torch.save checkpoints
     (rewritten in place, saved as new step files, and saved into step
     folders of which only the newest 2 are kept, the oldest rmtree'd after
     each save, lossless and lossy),
     append to a log (open/append/close), create small files (inline and
     blob sized) and write a file that is fsynced half way; every
     acknowledgement (close returned, fsync returned, user.ckptfs.state read
     as "committed") goes to a journal outside the mount;
  3. SIGKILLs the daemon at a random moment, kills the writers, lazily
     unmounts the dead mount (fusermount3 -u -z) and remounts;
  4. checks every file against the journal: a file acknowledged as committed
     or fsynced reads back as that version or a later closed one, a deleted
     one stays deleted, (lossless:
     bit-exact; lossy: torch.load and per-tensor rel L2 <= budget; fsynced:
     a prefix at least as long as the fsynced part), nothing else appears,
     every file is committed after recovery, `ckptfs fsck` is clean, and
     after `ckptfs gc --grace 0` every object on disk is reachable from a
     manifest (directly or as a delta base) and every reachable one exists.

Usage: crash_harness.py --iterations N --seed S [--ckptfs BIN] [--keep]
Prints one JSON summary on stdout; exit status 1 when an iteration failed.
"""
import argparse
import io
import json
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_CKPTFS = os.environ.get("CKPTFS_BIN", os.path.join(REPO, "build", "mount-tools", "ckptfs"))
BUDGET = 0.01
POLICY = f"""[defaults]
mode = "lossy"
rel_l2 = {BUDGET}

[[rule]]
files = "exact/*"
mode = "lossless"
"""
MANIFEST_MAGIC = b"CKFSMAN1"
ACK_KINDS = ("closed", "committed", "fsync", "deleted")  # journal events counted in the summary
KIND_BLOB, KIND_RAW = 1, 2


# ---------------------------------------------------------------- the writer
# Runs as a separate process (`--writer SPEC`) so that it can be SIGKILLed
# with the daemon; it only needs the standard library.

def _journal(fd, **event):
    os.write(fd, (json.dumps(event) + "\n").encode())  # O_APPEND: one atomic line


def _state(path):
    try:
        return os.getxattr(path, "user.ckptfs.state").decode()
    except OSError:
        return None


def _ack_commit(jfd, path, rel, version, wait, rng):
    """Journal 'committed' once user.ckptfs.state says so (this writer owns the file)."""
    deadline = time.time() + (3.0 if wait else 0.0)
    while True:
        if _state(path) == "committed":
            _journal(jfd, f=rel, v=version, ev="committed")
            return
        if time.time() >= deadline:
            return
        time.sleep(rng.uniform(0.005, 0.03))


def _write_task(task, mnt, jfd, seed):
    rng = random.Random(f"{seed}:{task['name']}")
    for version, src in enumerate(task["versions"]):
        rel = task["paths"][version]
        path = os.path.join(mnt, rel)
        with open(src, "rb") as f:
            data = f.read()
        _journal(jfd, f=rel, v=version, ev="start")
        if task["mode"] == "append":
            prev = os.path.getsize(task["versions"][version - 1]) if version else 0
            with open(path, "ab") as f:
                f.write(data[prev:])
                _journal(jfd, f=rel, v=version, ev="closing")
        else:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                half = len(data) // 2 if task["mode"] == "fsync_half" else len(data)
                for off in range(0, half, 1 << 20):
                    f.write(data[off:min(half, off + (1 << 20))])
                if task["mode"] == "fsync_half":
                    f.flush()
                    # An fsync the daemon finished but could not answer
                    # before the kill may make these bytes durable too.
                    _journal(jfd, f=rel, v=version, ev="fsync_start", len=half)
                    os.fsync(f.fileno())
                    _journal(jfd, f=rel, v=version, ev="fsync", len=half)
                    time.sleep(rng.uniform(0, 0.05))
                    for off in range(half, len(data), 1 << 20):
                        f.write(data[off:min(len(data), off + (1 << 20))])
                # Likewise a close in flight at the kill may commit the version.
                _journal(jfd, f=rel, v=version, ev="closing")
        _journal(jfd, f=rel, v=version, ev="closed")
        _ack_commit(jfd, path, rel, version, rng.random() < 0.5, rng)
        keep = task.get("keep")
        if keep and version >= keep:
            # A trainer's rotation: the oldest step folder goes (rmtree)
            # once the new one is saved; retained versions delta on it.
            old = task["paths"][version - keep]
            _journal(jfd, f=old, v=version - keep, ev="deleting")
            shutil.rmtree(os.path.join(mnt, os.path.dirname(old)))
            _journal(jfd, f=old, v=version - keep, ev="deleted")


def writer_main(spec_path):
    with open(spec_path) as f:
        spec = json.load(f)
    jfd = os.open(spec["journal"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    threads = [threading.Thread(target=_write_task, args=(t, spec["mnt"], jfd, spec["seed"]), daemon=True)
               for t in spec["tasks"]]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    _journal(jfd, ev="writer_done")


# ------------------------------------------------------------- content setup

def _tensor_versions(torch, rng, count, shapes):
    """A training-like sequence of state dicts: each version nudges the last."""
    g = torch.Generator().manual_seed(rng.randrange(1 << 31))
    state = {name: torch.randn(*shape, generator=g) for name, shape in shapes.items()}
    out = []
    for step in range(count):
        if step:
            state = {k: v + 0.01 * torch.randn(*v.shape, generator=g) for k, v in state.items()}
        d = dict(state)
        d["step"] = torch.tensor([step], dtype=torch.int64)
        buf = io.BytesIO()
        torch.save(d, buf)
        out.append(buf.getvalue())
    return out


def make_tasks(torch, rng, src, scale):
    """Writes every version's bytes under src/; returns writer tasks."""
    tasks = []

    def add(name, mode, contents, paths):
        files = []
        for i, data in enumerate(contents):
            p = os.path.join(src, f"{name}.{i}")
            with open(p, "wb") as f:
                f.write(data)
            files.append(p)
        tasks.append({"name": name, "mode": mode, "versions": files, "paths": paths})

    shapes = {"fc1.weight": (256 * scale, 512), "fc1.bias": (256 * scale,), "fc2.weight": (64, 256 * scale)}
    n = 6
    for policy_dir in ("exact", "lossy"):
        # One checkpoint rewritten in place, and a run that saves step files.
        add(f"{policy_dir}-inplace", "write", _tensor_versions(torch, rng, n, shapes), [f"{policy_dir}/ckpt.pt"] * n)
        add(f"{policy_dir}-steps", "write", _tensor_versions(torch, rng, n, shapes),
            [f"{policy_dir}/step-{i}.pt" for i in range(n)])
        # Step folders with keep-newest-2 rotation.
        add(f"{policy_dir}-rotate", "write", _tensor_versions(torch, rng, n, shapes),
            [f"{policy_dir}/run/checkpoint-{100 * (i + 1)}/model.pt" for i in range(n)])
        tasks[-1]["keep"] = 2
    lines, log = [], []
    for i in range(40):
        lines.append(f"step {i} loss {rng.random():.6f} {'x' * rng.randrange(0, 200)}\n".encode())
        log.append(b"".join(lines))
    add("log", "append", log, ["logs/train.log"] * len(log))
    small = [rng.randbytes(rng.choice([0, 1, 100, 3000, 3072, 3073, 9000, 70000])) for _ in range(25)]
    add("small", "write", small, [f"small/f{i}" for i in range(len(small))])
    add("fsync", "fsync_half", [rng.randbytes(rng.randrange(1 << 20, 3 << 20)) for _ in range(4)],
        ["exact/journal.bin"] * 4)
    return tasks


# ---------------------------------------------------------------- checking

def read_journal(path):
    events = []
    with open(path) as f:
        for line in f:
            if line.endswith("\n"):  # a SIGKILLed writer never leaves half a line, but be safe
                events.append(json.loads(line))
    return events


def expectations(tasks, events):
    """Per file: (acceptable full versions, acceptable fsynced prefix, lossy?)."""
    by_path = {}
    for t in tasks:
        for v, (rel, src) in enumerate(zip(t["paths"], t["versions"])):
            by_path.setdefault(rel, {"versions": {}, "started": [], "closed": [], "acked": None, "prefix": None,
                                     "in_flight": []})
            by_path[rel]["versions"][v] = src
    for e in events:
        if "f" not in e:
            continue
        st = by_path[e["f"]]
        if e["ev"] == "start":
            st["started"].append(e["v"])
        elif e["ev"] == "closed":
            st["closed"].append(e["v"])
        elif e["ev"] == "closing":
            st["in_flight"].append((e["v"], None))
        elif e["ev"] == "fsync_start":
            st["in_flight"].append((e["v"], e["len"]))
        elif e["ev"] == "deleting":
            st["deleting"] = True
        elif e["ev"] == "deleted":
            st["deleted"] = True
        elif e["ev"] == "committed":
            st["acked"] = max(st["acked"] if st["acked"] is not None else -1, e["v"])
        elif e["ev"] == "fsync":
            if st["acked"] is None or e["v"] > st["acked"]:
                st["acked"] = e["v"]
                st["prefix"] = (e["v"], e["len"])
    return {rel: st for rel, st in by_path.items() if st["started"]}


def rel_l2_ok(torch, got_bytes, want_path, budget):
    try:
        got = torch.load(io.BytesIO(got_bytes))
    except Exception:
        return False
    want = torch.load(want_path)
    if set(got) != set(want):
        return False
    for k, w in want.items():
        g = got[k]
        if g.dtype != w.dtype or g.shape != w.shape:
            return False
        if not w.is_floating_point():
            if not torch.equal(g, w):
                return False
            continue
        norm = torch.linalg.norm(w.double())
        err = torch.linalg.norm((g.double() - w.double()))
        if err > budget * norm * 1.0001 + 1e-12:
            return False
    return True


def check_file(torch, rel, st, got):
    """Returns None when `got` is acceptable, else a description."""
    if st.get("deleted"):
        return None if got is None else "a deleted file is back"
    if st.get("deleting") and got is None:
        return None  # the rmtree in flight at the kill got this far
    why = _check_acknowledged(torch, rel, st, got)
    if why is None:
        return None
    # Not an acknowledged outcome. Still fine if it is what an operation in
    # flight at the kill (never acknowledged, so no promise either way) may
    # have made durable: a close (the whole version) or an fsync (a prefix
    # at least as long as what was written before it), of a version after
    # the acknowledged one.
    acked = st["acked"] if st["acked"] is not None else -1
    for v, min_len in st.get("in_flight", []):
        if v < acked or got is None:
            continue
        with open(st["versions"][v], "rb") as f:
            want = f.read()
        if got == want or (min_len is not None and len(got) >= min_len and want.startswith(got)):
            return None
        if rel.startswith("lossy/") and len(got) == len(want) and rel_l2_ok(torch, got, st["versions"][v], BUDGET):
            return None
    return why


def _check_acknowledged(torch, rel, st, got):
    lossy = rel.startswith("lossy/")
    acked = st["acked"] if st["acked"] is not None else -1
    candidates = [v for v in sorted(set(st["closed"])) if v >= acked]
    if acked >= 0 and st["prefix"] and st["prefix"][0] == acked and acked not in candidates:
        candidates.append(acked)  # fsynced but not closed: checked as a prefix below
    for v in candidates:
        with open(st["versions"][v], "rb") as f:
            want = f.read()
        if got == want:
            return None
        if lossy and got is not None and len(got) == len(want) and rel_l2_ok(torch, got, st["versions"][v], BUDGET):
            return None
        if st["prefix"] and st["prefix"][0] == v and got is not None and len(got) >= st["prefix"][1] \
                and want.startswith(got):
            return None
    if acked < 0 and got in (None, b""):
        return None  # nothing was acknowledged: absent or the empty file create() made
    if acked < 0 and not candidates:
        return f"unacknowledged content ({None if got is None else len(got)} bytes)"
    return (f"acked version {acked} (prefix {st['prefix']}), closed {sorted(set(st['closed']))}: got "
            f"{None if got is None else len(got)} bytes matching none")


def manifest_objects(path):
    """(kind, object hex) of the newest valid slot of a manifest file, per STORE.md §2."""
    # Checksums are fsck's business; here only the fields matter.
    with open(path, "rb") as f:
        data = f.read(8192)
    best = None
    for off in (0, 4096):
        slot = data[off:off + 4096]
        if len(slot) < 104 or slot[:8] != MANIFEST_MAGIC:
            continue
        kind = slot[10]
        seq = struct.unpack_from("<Q", slot, 16)[0]
        obj = slot[40:56]
        if best is None or seq > best[0]:
            best = (seq, kind, obj)
    if best is None:
        return None
    _, kind, obj = best
    return kind, obj.hex()  # the id's 16 bytes in the order of its hex name


def reachable_objects(ckptfs, backing):
    objects_dir = os.path.join(backing, ".ckptfs", "objects")
    on_disk = {name for d in os.listdir(objects_dir) for name in os.listdir(os.path.join(objects_dir, d))}
    roots = set()
    for dirpath, dirnames, filenames in os.walk(backing):
        if dirpath == backing and ".ckptfs" in dirnames:
            dirnames.remove(".ckptfs")
        for fn in filenames:
            m = manifest_objects(os.path.join(dirpath, fn))
            if m and m[0] in (KIND_BLOB, KIND_RAW):
                roots.add(m[1])
    live, todo = set(), list(roots)
    while todo:
        h = todo.pop()
        if h in live:
            continue
        live.add(h)
        p = os.path.join(objects_dir, h[:2], h)
        if not os.path.exists(p):
            continue
        r = subprocess.run([ckptfs, "inspect-blob", p, "--json"], capture_output=True, text=True)
        if r.returncode == 0:
            base = json.loads(r.stdout).get("base")
            if base:
                todo.append(base)
    return on_disk, live


# ---------------------------------------------------------------- mounting

def is_mounted(path):
    path = os.path.realpath(path)
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == path for line in f)


def wait_dead(pid, timeout=30):
    """Until every thread has exited: a zombie group leader whose other
    threads still run holds the daemon's files (and its staging area's
    flock, so a remount would not recover that area)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                zombie = f.read().rsplit(")", 1)[1].split()[0] == "Z"
            if zombie and len(os.listdir(f"/proc/{pid}/task")) <= 1:
                return
        except (FileNotFoundError, ProcessLookupError):
            return
        time.sleep(0.02)
    raise RuntimeError(f"daemon {pid} did not exit")


def mount(ckptfs, backing, mnt, opts):
    r = subprocess.run([ckptfs, "mount", backing, mnt, "-o", opts], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"mount failed ({r.returncode}): {r.stderr.strip()}")
    return int(os.getxattr(mnt, "user.ckptfs.pid"))


def run_iteration(ckptfs, torch, seed, work, max_kill_s):
    rng = random.Random(seed)
    result = {"seed": seed, "problems": []}
    for sub in ("backing", "mnt", "src"):
        os.makedirs(os.path.join(work, sub))
    backing, mnt, src = (os.path.join(work, s) for s in ("backing", "mnt", "src"))
    policy = os.path.join(work, "policy.toml")
    with open(policy, "w") as f:
        f.write(POLICY)
    tasks = make_tasks(torch, rng, src, scale=rng.choice([1, 2]))
    opts = (f"log={work}/ckptfs.log,loglevel=info,gc_interval=0,policy={policy},gpu=off,"
            f"threads={rng.choice([1, 2])},keyframe={rng.choice([3, 10])}")
    pid = mount(ckptfs, backing, mnt, opts)
    for d in ("exact", "lossy", "logs", "small"):
        os.makedirs(os.path.join(mnt, d))
    journal = os.path.join(work, "journal.jsonl")
    spec = os.path.join(work, "writer.json")
    with open(spec, "w") as f:
        json.dump({"journal": journal, "mnt": mnt, "seed": seed, "tasks": tasks}, f)
    writer = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--writer", spec],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 30
    while not (os.path.exists(journal) and os.path.getsize(journal) > 0):
        if time.time() > deadline:
            raise RuntimeError("the writer never started")
        time.sleep(0.01)
    kill_after = rng.uniform(0.0, max_kill_s)
    time.sleep(kill_after)
    result["kill_after_s"] = round(kill_after, 3)
    os.kill(pid, signal.SIGKILL)
    wait_dead(pid)
    writer.kill()
    writer.wait()
    subprocess.run(["fusermount3", "-u", "-z", mnt], capture_output=True)
    events = read_journal(journal)
    result["writer_finished"] = any(e.get("ev") == "writer_done" for e in events)
    result["acks"] = {k: sum(1 for e in events if e.get("ev") == k) for k in ACK_KINDS}

    pid = mount(ckptfs, backing, mnt, opts)
    with open(os.path.join(work, "ckptfs.log")) as f:
        log = f.read()
    result["recovered_commits"] = log.count("finished an interrupted commit")
    result["orphan_staging_removed"] = log.count("removed orphan staging file")
    try:
        exp = expectations(tasks, events)
        result["files_checked"] = len(exp)
        for rel, st in sorted(exp.items()):
            p = os.path.join(mnt, rel)
            try:
                with open(p, "rb") as f:
                    got = f.read()
            except FileNotFoundError:
                got = None
            except OSError as e:
                result["problems"].append(f"{rel}: read failed: {e}")
                continue
            why = check_file(torch, rel, st, got)
            if why:
                result["problems"].append(f"{rel}: {why}")
            # A create() killed before its first manifest record leaves an
            # empty plain file: fine when nothing was acknowledged.
            fine_states = ("committed", "plain") if got == b"" and st["acked"] is None else ("committed",)
            if got is not None and _state(p) not in fine_states:
                result["problems"].append(f"{rel}: state {_state(p)} after recovery")
    finally:
        r = subprocess.run([ckptfs, "umount", mnt], capture_output=True, text=True)
        if r.returncode != 0:
            result["problems"].append(f"umount: {r.stderr.strip()}")
            subprocess.run(["fusermount3", "-u", "-z", mnt], capture_output=True)
    left = [os.path.join(d, f) for d in ("staging", "tmp")
            for f in os.listdir(os.path.join(backing, ".ckptfs", d))]
    if left:
        result["problems"].append(f"left in .ckptfs after a clean unmount: {left}")
    r = subprocess.run([ckptfs, "fsck", backing, "--json"], capture_output=True, text=True)
    if r.returncode != 0:
        result["problems"].append(f"fsck exit {r.returncode}: {r.stdout.strip()[:2000]}")
    r = subprocess.run([ckptfs, "gc", backing, "--grace", "0", "--json"], capture_output=True, text=True)
    if r.returncode != 0:
        result["problems"].append(f"gc exit {r.returncode}: {r.stderr.strip()}")
    else:
        result["gc_removed"] = json.loads(r.stdout)["removed"]
    on_disk, live = reachable_objects(ckptfs, backing)
    result["objects"] = len(on_disk)
    if on_disk - live:
        result["problems"].append(f"orphan objects after gc: {sorted(on_disk - live)}")
    if live - on_disk:
        result["problems"].append(f"referenced objects missing: {sorted(live - on_disk)}")
    return result


def run(iterations, seed, ckptfs=DEFAULT_CKPTFS, keep=False, max_kill_s=2.0, workroot=None):
    import torch
    torch.set_num_threads(1)
    results = []
    for i in range(iterations):
        it_seed = seed * 1000003 + i
        work = tempfile.mkdtemp(prefix=f"ckptfs-crash-{it_seed}-", dir=workroot)
        try:
            res = run_iteration(ckptfs, torch, it_seed, work, max_kill_s)
        except Exception as e:  # an iteration that could not run is a failure too
            res = {"seed": it_seed, "problems": [f"harness error: {e!r}"]}
        finally:
            mnt = os.path.join(work, "mnt")
            if os.path.isdir(mnt) and is_mounted(mnt):
                subprocess.run(["fusermount3", "-u", "-z", mnt], capture_output=True)
        res["workdir"] = work
        if res["problems"] and not keep:
            keep_this = True  # a failing iteration keeps its store for inspection
        else:
            keep_this = keep
        if not keep_this:
            shutil.rmtree(work, ignore_errors=True)
            res.pop("workdir")
        results.append(res)
        print(f"iteration {i} seed {it_seed}: {'ok' if not res['problems'] else res['problems']}", file=sys.stderr)
    failed = [r for r in results if r["problems"]]
    summary = {
        "iterations": iterations,
        "seed": seed,
        "failed": len(failed),
        "files_checked": sum(r.get("files_checked", 0) for r in results),
        "acks": {k: sum(r.get("acks", {}).get(k, 0) for r in results) for k in ACK_KINDS},
        "writer_finished_before_kill": sum(1 for r in results if r.get("writer_finished")),
        "recovered_commits": sum(r.get("recovered_commits", 0) for r in results),
        "orphan_staging_removed": sum(r.get("orphan_staging_removed", 0) for r in results),
        "objects_after_gc": sum(r.get("objects", 0) for r in results),
        "gc_removed": sum(r.get("gc_removed", 0) for r in results),
        "failures": failed,
    }
    return summary


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--ckptfs", default=DEFAULT_CKPTFS)
    ap.add_argument("--max-kill-s", type=float, default=2.0, help="the kill comes uniformly in [0, this] s")
    ap.add_argument("--workdir", default=None, help="parent of the per-iteration directories (default $TMPDIR)")
    ap.add_argument("--keep", action="store_true", help="keep every iteration's directory")
    ap.add_argument("--writer", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.writer:
        return writer_main(a.writer)
    summary = run(a.iterations, a.seed, a.ckptfs, a.keep, a.max_kill_s, a.workdir)
    print(json.dumps(summary, indent=1))
    return 1 if summary["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
