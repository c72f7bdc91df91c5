"""Many nodes, one shared store, on a real distributed filesystem: two ckptfs
daemons on two GlusterFS client mounts of one volume (fs/STORE.md §3, §7).
Skipped only where FUSE or the GlusterFS packages are missing."""
import io
import json
import os
import random
import subprocess
import threading
import time

import pytest

from cluster import NodeDaemon, gluster_cluster
from conftest import CKPTFS

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def cluster():
    yield from gluster_cluster()


@pytest.fixture
def nodes(cluster, tmp_path, request):
    store = f"store-{request.node.name[:40]}-{os.getpid()}"
    a = NodeDaemon(tmp_path, cluster.nodes[0], "a", store)
    b = NodeDaemon(tmp_path, cluster.nodes[1], "b", store)
    try:
        yield a, b
    finally:
        a.teardown()
        b.teardown()


_SHARDS = {}


def shard(rank, step):
    """A rank's shard at `step`: an MLP and its AdamW state after `step` + 1
    training steps (about 2.4 MB), as (state dict, torch.save bytes)."""
    if (rank, step) not in _SHARDS:
        torch.manual_seed(100 + rank)
        model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                                    torch.nn.ReLU(), torch.nn.Linear(256, 16))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        g = torch.Generator().manual_seed(rank)
        for _ in range(step + 1):
            x = torch.randn(64, 256, generator=g)
            loss = model(x).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        sd = {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}
        buf = io.BytesIO()
        torch.save(sd, buf)
        _SHARDS[(rank, step)] = (sd, buf.getvalue())
    return _SHARDS[(rank, step)]


def save_fsync(path, data):
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def read(path):
    with open(path, "rb") as f:
        return f.read()


def assert_close(got_bytes, want):
    """The weights within the default budget; the optimizer state loads with
    its structure (its error is measured in step space, not per tensor)."""
    got = torch.load(io.BytesIO(got_bytes))
    assert got["step"] == want["step"]
    assert set(got["model"]) == set(want["model"])
    for k, v in want["model"].items():
        err = float((got["model"][k] - v).norm() / max(float(v.norm()), 1e-30))
        assert err <= 0.02, (k, err)
    assert got["optimizer"]["param_groups"] == want["optimizer"]["param_groups"]
    for i, st in want["optimizer"]["state"].items():
        assert int(got["optimizer"]["state"][i]["step"]) == int(st["step"])
        assert got["optimizer"]["state"][i]["exp_avg"].shape == st["exp_avg"].shape


def test_two_nodes_write_their_ranks_read_each_other_and_gc_runs(nodes):
    a, b = nodes
    a.mount("gc_interval=1,gc_grace=60")  # staging=auto: local on a shared store
    b.mount(f"staging={b.local_staging}")
    with open(a.log) as f:
        assert "staging in /var/tmp/ckptfs-staging" in f.read()
    daemons = [a, b]
    stop_gc = threading.Event()
    gc_runs = []

    def gc_loop():  # GC from node B's side (default grace) while both commit
        while not stop_gc.is_set():
            r = subprocess.run([CKPTFS, "gc", b.backing, "--json"], capture_output=True, text=True)
            gc_runs.append(r.returncode)

    gc_thread = threading.Thread(target=gc_loop)
    gc_thread.start()
    try:
        for step in range(10):
            os.makedirs(a.path(f"step-{step}"), exist_ok=True)
            shards = [shard(r, step) for r in range(2)]

            def save(rank, step=step, shards=shards):
                save_fsync(daemons[rank].path(f"step-{step}", f"rank{rank}.pt"), shards[rank][1])

            writers = [threading.Thread(target=save, args=(r,)) for r in range(2)]
            for w in writers:
                w.start()
            if step > 0:  # meanwhile each node reads the other's previous shard
                for r in range(2):
                    assert_close(read(daemons[r].path(f"step-{step - 1}", f"rank{1 - r}.pt")), shard(1 - r, step - 1)[0])
            for w in writers:
                w.join()
            # A tracker rewritten in place by rank 0 after every save: the other
            # node reads the new value right after fsync (close-to-open).
            save_fsync(a.path("latest"), str(step).encode())
            assert read(b.path("latest")) == str(step).encode()
            # Both nodes read both shards, the same bytes from the same blob.
            for r in range(2):
                got_a = read(a.path(f"step-{step}", f"rank{r}.pt"))
                assert got_a == read(b.path(f"step-{step}", f"rank{r}.pt"))
                assert_close(got_a, shards[r][0])
    finally:
        stop_gc.set()
        gc_thread.join()
    assert gc_runs and all(rc == 0 for rc in gc_runs)
    # The raw bytes never went to the store: no staging files in it.
    in_store = os.path.join(a.backing, ".ckptfs", "staging")
    assert not [n for d, _, ns in os.walk(in_store) for n in ns if n != ".lock"]
    # Each rank's shards chain across the step folders, including the
    # versions the other node committed.
    chained = [json.loads(a.cli("inspect", os.path.join(a.backing, f"step-9/rank{r}.pt"), "--json").stdout)
               for r in range(2)]
    assert all(c["chain_depth"] >= 1 for c in chained), chained
    total = json.loads(a.cli("stats", a.backing, "--json").stdout)["total"]
    assert total["ratio"] > 3, total
    a.umount()
    b.umount()
    for node in (a, b):  # fsck clean from either node
        r = node.cli("fsck", node.backing, check=False)
        assert r.returncode == 0, r.stdout


def test_kill9_rounds_on_both_nodes_lose_nothing_acknowledged(nodes, tmp_path):
    a, b = nodes
    daemons = [a, b]
    opts = ["", f"staging={b.local_staging}"]
    for d, o in zip(daemons, opts):
        d.mount(o)
    rng = random.Random(7)
    acked = {}  # path relative to the store -> bytes (fsync returned)
    big = shard(0, 3)[1] * 4  # an 8 MB file whose commit the kill interrupts
    for rnd in range(20):
        victim = daemons[rnd % 2]
        other = daemons[1 - rnd % 2]
        rel = f"round-{rnd}/ack.bin"
        os.makedirs(victim.path(f"round-{rnd}"), exist_ok=True)
        data = rng.randbytes(256 << 10)
        save_fsync(victim.path(rel), data)
        acked[rel] = data
        # Unacknowledged work in flight: a checkpoint closed without fsync
        # (its commit runs) and one being fsynced.
        with open(victim.path(f"round-{rnd}", "closed.pt"), "wb") as f:
            f.write(big)
        inflight = threading.Thread(
            target=lambda: _ignore_errors(save_fsync, victim.path(f"round-{rnd}", "fsyncing.pt"), big))
        inflight.start()
        time.sleep(rng.uniform(0.0, 0.3))
        victim.kill9()
        inflight.join()
        # The other node reads every acknowledged file while the victim is down.
        for p, want in acked.items():
            assert read(other.path(p)) == want, p
        victim.mount(opts[rnd % 2])
    for d in daemons:
        for p, want in acked.items():
            assert read(d.path(p)) == want, p
        d.umount()
    for d in daemons:
        r = d.cli("fsck", d.backing, check=False)
        assert r.returncode == 0, r.stdout
    # No dead daemon left anything behind in the store's staging or temp areas.
    meta = os.path.join(a.backing, ".ckptfs")
    assert not [n for sub in ("staging", "tmp") for _, _, ns in os.walk(os.path.join(meta, sub)) for n in ns]


def _ignore_errors(fn, *args):
    try:
        fn(*args)
    except OSError:
        pass  # the daemon died under it: not acknowledged


def test_restore_offline_from_the_node_without_a_daemon(nodes, tmp_path):
    a, b = nodes
    a.mount()
    want = {}
    for step in range(3):
        os.makedirs(a.path(f"step-{step}"), exist_ok=True)
        sd, data = shard(0, step)
        save_fsync(a.path(f"step-{step}", "model.pt"), data)
        want[step] = read(a.path(f"step-{step}", "model.pt"))
    a.umount()
    # Node B never ran a daemon: it restores from its own client mount.
    for step in range(3):
        out = str(tmp_path / f"restored-{step}.pt")
        b.cli("restore", os.path.join(b.backing, f"step-{step}", "model.pt"), out)
        assert read(out) == want[step]
    r = b.cli("fsck", b.backing, check=False)
    assert r.returncode == 0, r.stdout


def test_cluster_benchmark_runs_at_smoke_size(cluster, tmp_path):
    """scripts/bench/cluster.sh's benchmark, tiny: it runs and reports every target."""
    bench = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "scripts", "bench",
                         "cluster_bench.py")
    work = tmp_path / "work"
    work.mkdir()
    r = subprocess.run(["/usr/bin/python3", bench, "--ckptfs", CKPTFS, "--node-a", cluster.nodes[0], "--node-b",
                        cluster.nodes[1], "--work", str(work), "--model-mb", "20", "--runs", "2"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    assert set(out["medians"]) == {"gluster", "ckptfs", "ckptfs-store"}
    assert out["ratio"]["ckptfs"] > 3
    for name in ("ckptfs", "ckptfs-store"):
        assert all(v["median"] > 0 for v in out["speedup_vs_gluster"][name].values())


def test_close_then_ckptfs_sync_makes_a_save_visible_on_the_other_node(nodes):
    """A trainer that saves without fsync, then lets another node load:
    `ckptfs sync MOUNT` returns once the closed files are in the store."""
    a, b = nodes
    a.mount()
    b.mount()
    for step in range(3):
        sd, data = shard(0, step)
        with open(a.path("ckpt.pt"), "wb") as f:  # rewritten in place, no fsync
            f.write(data)
        r = subprocess.run([CKPTFS, "sync", a.mnt], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert a.pending() == 0
        assert_close(read(b.path("ckpt.pt")), sd)
    r = subprocess.run([CKPTFS, "sync", a.backing], capture_output=True, text=True)
    assert r.returncode == 1 and "not a ckptfs mount" in r.stderr
