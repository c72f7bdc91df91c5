"""Framework checkpoint layouts through the mount (issue #24): a later
version is a delta frame against the previous version of the *same file*
wherever the framework put it (step folders, staging renames, per-rank
files, remounts), never against another rank's or another run's file, and a
byte-identical copy names the stored blob instead of storing it again.

Bases are read from the virtual xattrs user.ckptfs.object / .base /
.chain_depth right after each commit (lossy=off: reads are bit-exact).
"""
import json
import os
import pickle
import shutil
import subprocess
import time

import pytest

torch = pytest.importorskip("torch")
torch.set_num_threads(2)

from conftest import CKPTFS, force_unmount  # noqa: E402


def weights(seed, rank=0, drift=None):
    """A small model state; `drift` (a previous state) gives the next step."""
    g = torch.Generator().manual_seed(1000 * rank + seed)
    if drift is None:
        return {"fc1.weight": torch.randn(192, 256, generator=g), "fc1.bias": torch.randn(192, generator=g),
                "fc2.weight": torch.randn(64, 192, generator=g)}
    return {k: v + 1e-3 * torch.randn(v.shape, generator=g) for k, v in drift.items()}


def optimizer(model, seed):
    """Adam-like state that follows the weights (so versions are related);
    `seed` only tells ranks apart."""
    return {"state": {i: {"exp_avg": 1e-3 * v + seed * 1e-9, "exp_avg_sq": 1e-6 * v * v}
                      for i, v in enumerate(model.values())},
            "param_groups": [{"lr": 1e-3, "params": list(range(len(model)))}]}


def xattr(path, name):
    return os.getxattr(path, "user.ckptfs." + name).decode()


def base_of(path):
    try:
        return xattr(path, "base")
    except OSError:
        return ""


def assert_delta_on(path, previous):
    """`path` is a delta frame whose base is the blob `previous` stored."""
    assert base_of(path) == xattr(previous, "object"), (path, previous)
    assert int(xattr(path, "chain_depth")) == int(xattr(previous, "chain_depth")) + 1


def test_trainer_step_folders_with_staging_rename_and_rotation(store):
    """checkpoint-N/{pytorch_model.bin, optimizer.pt, ...} written into
    tmp-checkpoint-N/ and renamed, the oldest folders removed (keep 2), a
    remount in the middle: each file chains on its previous save."""
    store.mount()
    run = store.path("out")
    os.makedirs(run)
    model = weights(0)
    saved = {}
    for step in (100, 200, 300, 400):
        if step == 300:  # the daemon forgets; the store still knows
            store.umount()
            store.mount()
        model = weights(step, drift=model)
        staging = os.path.join(run, f"tmp-checkpoint-{step}")
        os.makedirs(staging)
        torch.save(model, os.path.join(staging, "pytorch_model.bin"))
        torch.save(optimizer(model, 0), os.path.join(staging, "optimizer.pt"))
        torch.save({"last_epoch": step}, os.path.join(staging, "scheduler.pt"))
        with open(os.path.join(staging, "trainer_state.json"), "w") as f:
            f.write('{"global_step": %d}' % step)
        final = os.path.join(run, f"checkpoint-{step}")
        os.rename(staging, final)
        store.wait_idle()
        if step > 100:
            prev = os.path.join(run, f"checkpoint-{step - 100}")
            for name in ("pytorch_model.bin", "optimizer.pt"):
                assert_delta_on(os.path.join(final, name), os.path.join(prev, name))
        saved[step] = model
        folders = sorted((d for d in os.listdir(run) if d.startswith("checkpoint-")), key=lambda d: int(d[11:]))
        for old in folders[:-2]:
            shutil.rmtree(os.path.join(run, old))
    got = torch.load(os.path.join(run, "checkpoint-400", "pytorch_model.bin"))
    for k, v in saved[400].items():
        assert torch.equal(got[k], v)
    store.umount()
    r = store.cli("gc", store.backing, "--grace", "0")
    assert r.returncode == 0, r.stderr
    r = store.cli("fsck", store.backing)
    assert r.returncode == 0, r.stdout + r.stderr


def test_per_rank_files_chain_on_their_own_rank(store):
    """Megatron's iter_N/mp_rank_RR/ and DeepSpeed's per-rank optimizer
    files in one folder: rank r's file deltas on rank r's previous file; at
    the first step no rank's file is a base of another's."""
    store.mount()
    models = {r: weights(0, rank=r) for r in (0, 1)}
    for step in (1000, 2000, 3000):
        for r in (0, 1):
            models[r] = weights(step, rank=r, drift=models[r])
            d = store.path(f"iter_{step:07d}", f"mp_rank_{r:02d}")
            os.makedirs(d)
            torch.save({"model": models[r], "optimizer": optimizer(models[r], r)},
                       os.path.join(d, "model_optim_rng.pt"))
            ds = store.path(f"global_step{step}")
            os.makedirs(ds, exist_ok=True)
            torch.save({"optimizer_state_dict": optimizer(models[r], r)},
                       os.path.join(ds, f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt"))
            store.wait_idle()
        with open(store.path("latest_checkpointed_iteration.txt"), "w") as f:
            f.write(str(step))
    for r in (0, 1):
        first = store.path("iter_0001000", f"mp_rank_{r:02d}", "model_optim_rng.pt")
        assert xattr(first, "chain_depth") == "0"
        first_ds = store.path("global_step1000", f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt")
        assert xattr(first_ds, "chain_depth") == "0", "rank 1's first file must not delta on rank 0's"
        for step in (2000, 3000):
            assert_delta_on(store.path(f"iter_{step:07d}", f"mp_rank_{r:02d}", "model_optim_rng.pt"),
                            store.path(f"iter_{step - 1000:07d}", f"mp_rank_{r:02d}", "model_optim_rng.pt"))
            assert_delta_on(store.path(f"global_step{step}", f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt"),
                            store.path(f"global_step{step - 1000}", f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt"))


def test_lightning_top1_and_last_copy(store):
    """epoch=E-step=S.ckpt (the previous one deleted after each save) and
    last.ckpt as a byte-identical copy: the copy stores nothing new, each
    epoch file deltas on the deleted previous one."""
    store.mount()
    d = store.path("lightning_logs", "version_0", "checkpoints")
    os.makedirs(d)
    model = weights(0)
    previous = None
    for epoch, step in enumerate((50, 100, 150)):
        model = weights(step, drift=model)
        path = os.path.join(d, f"epoch={epoch}-step={step}.ckpt")
        torch.save({"state_dict": model, "optimizer_states": [optimizer(model, 0)], "epoch": epoch}, path)
        store.wait_idle()
        if previous is not None:
            obj_prev = xattr(previous, "object")
            depth_prev = int(xattr(previous, "chain_depth"))
            os.remove(previous)
            assert base_of(path) == obj_prev
            assert int(xattr(path, "chain_depth")) == depth_prev + 1
        last = os.path.join(d, "last.ckpt")
        shutil.copy2(path, last)
        store.wait_idle()
        assert xattr(last, "object") == xattr(path, "object")
        previous = path
    with open(os.path.join(d, "last.ckpt"), "rb") as a, open(previous, "rb") as b:
        assert a.read() == b.read()


def test_file_rewritten_in_place_does_not_keep_its_old_versions(store):
    """A file rewritten in place (Lightning's last.ckpt when its copy is
    encoded before the epoch file it copies, a tracker) drops its previous
    version as a delete would: lossless deltas that save little start new
    chains instead of tying every old version to the newest, so the store
    after gc holds a few versions, not all of them."""
    store.mount("lossy=off")
    last = store.path("last.ckpt")
    model = weights(0)
    g = torch.Generator().manual_seed(5)
    sizes = []
    for step in range(1, 9):
        # Trained weights move every mantissa: a lossless delta saves little.
        model = {k: v + 3e-2 * torch.randn(v.shape, generator=g) for k, v in model.items()}
        torch.save({"state_dict": model, "epoch": step}, last)
        store.wait_idle()
        sizes.append(int(xattr(last, "stored_bytes")))
    depths = [int(xattr(last, "chain_depth"))]
    store.umount()
    store.cli("gc", store.backing, "--grace", "0")
    objects = os.path.join(store.backing, ".ckptfs", "objects")
    held = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(objects) for f in fs)
    # Without the rule all 8 versions stay chained (about 8 key frames of
    # bytes); with it, the newest's chain goes back a few versions at most.
    assert held < 4 * max(sizes), (held, sizes, depths)
    assert depths[0] < 4


def test_other_runs_are_not_bases(store):
    """Sibling run folders share no role: the second run's first save is a
    key frame even though its step folder looks like the first run's."""
    store.mount()
    model = weights(0)
    for run in ("run1", "run2"):
        d = store.path("exp", run, "checkpoint-100")
        os.makedirs(d)
        torch.save(model, os.path.join(d, "pytorch_model.bin"))
        store.wait_idle()
    # Same tensors, but another run: only a byte-identical file may be
    # shared, and then it is the same blob, not a delta.
    second = store.path("exp", "run2", "checkpoint-100", "pytorch_model.bin")
    first = store.path("exp", "run1", "checkpoint-100", "pytorch_model.bin")
    assert base_of(second) == ""
    assert xattr(second, "object") == xattr(first, "object")
    model2 = weights(1, drift=model)
    torch.save(model2, store.path("exp", "run2", "checkpoint-100", "pytorch_model.bin"))
    os.makedirs(store.path("exp", "run3", "checkpoint-100"))
    torch.save(model2, store.path("exp", "run3", "checkpoint-100", "model.pt"))
    store.wait_idle()
    assert xattr(store.path("exp", "run3", "checkpoint-100", "model.pt"), "chain_depth") == "0"


def test_copy_of_a_lossy_file_is_stored_once(store):
    """`cp` of a lossy checkpoint inside the mount copies its reconstruction
    (what reads return); that copy names the same blob."""
    store.mount("lossy=on")
    d = store.path("ckpts")
    os.makedirs(d)
    src = os.path.join(d, "best.ckpt")
    torch.save({"state_dict": weights(3)}, src)
    store.wait_idle()
    assert "lossy" in xattr(src, "codec")
    for dst in (os.path.join(d, "final.ckpt"), store.path("export.ckpt")):
        shutil.copyfile(src, dst)
        store.wait_idle()
        assert xattr(dst, "object") == xattr(src, "object")
        with open(src, "rb") as a, open(dst, "rb") as b:
            assert a.read() == b.read()


@pytest.mark.parametrize("options", ["lossy=on", "lossy=on,cache=4"], ids=["cached", "spilled"])
def test_an_open_that_began_before_the_commit_reads_one_version(store, tmp_path, options):
    """A copy made while a lossy file is committed (Lightning's `last.ckpt`,
    a `cp` right after the save) must not get the staged bytes up to the
    commit and the reconstruction after it: that mix fails the zip's CRCs.
    An open that read staged bytes goes on reading them; an open after the
    commit reads the reconstruction whole. With a chunk cache smaller than
    twice the file, its reconstruction goes to the spill in the background
    after the commit, while this open still reads the staged bytes."""
    store.mount(options)
    spilled = "cache=4" in options
    ref = tmp_path / "ref.ckpt"
    torch.save({"state_dict": {f"w{i}": torch.randn(512, 512) for i in range(4)}}, ref)
    raw = ref.read_bytes()
    p = store.path("epoch=0.ckpt")
    head = 64 << 10
    with open(p, "wb") as w:
        w.write(raw)
        w.flush()
        reader = open(p, "rb", buffering=0)
        first = reader.read(head)
    # The writer's close queues the commit; the reader is still open.
    deadline = time.time() + 60
    while xattr(p, "state") != "committed":
        assert time.time() < deadline, "not committed"
        time.sleep(0.02)
    store.wait_idle()
    if spilled:  # kept in the background after the commit
        while int(os.getxattr(store.mnt, "user.ckptfs.spilled")) < 1:
            assert time.time() < deadline, "reconstruction not spilled"
            time.sleep(0.02)
    rest = b""
    while chunk := reader.read(1 << 20):
        rest += chunk
    reader.close()
    assert first + rest == raw
    with open(p, "rb") as f:
        after = f.read()
    assert "lossy" in xattr(p, "codec") and after != raw  # the reconstruction differs
    assert len(after) == len(raw)
    torch.load(p)  # whole and consistent
    # What that open read, written back as a copy (last.ckpt), names the
    # same blob: the staged bytes' content key leads to it.
    copy = store.path("last.ckpt")
    with open(copy, "wb") as f:
        f.write(first + rest)
    store.wait_idle()
    assert xattr(copy, "object") == xattr(p, "object")


def test_ranks_written_by_two_daemons_into_one_store(store, tmp_path):
    """Two nodes, one shared store: each daemon writes its rank's file of
    every step; a daemon's first file of a rank it never wrote (a restart
    on another node) chains on the other daemon's file of that rank."""
    store.mount("lossy=off")
    node_b = str(tmp_path / "node_b")
    os.makedirs(node_b)
    r = subprocess.run([CKPTFS, "mount", store.backing, node_b, "-o", f"log={tmp_path}/b.log,gc_interval=0,lossy=off"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr

    def wait_b():
        while int(os.getxattr(node_b, "user.ckptfs.pending")) != 0:
            time.sleep(0.02)

    try:
        models = {r: weights(0, rank=r) for r in (0, 1)}
        for step in (100, 200, 300):
            for rank, root, wait in ((0, store.mnt, store.wait_idle), (1, node_b, wait_b)):
                if step == 300:  # the ranks change nodes
                    root, wait = (node_b, wait_b) if rank == 0 else (store.mnt, store.wait_idle)
                models[rank] = weights(step, rank=rank, drift=models[rank])
                d = os.path.join(root, f"step-{step}")
                os.makedirs(d, exist_ok=True)
                torch.save({"model": models[rank], "optimizer": optimizer(models[rank], rank)},
                           os.path.join(d, f"__{rank}_0.distcp"))
                wait()
        for rank in (0, 1):
            assert xattr(store.path("step-100", f"__{rank}_0.distcp"), "chain_depth") == "0"
            for step in (200, 300):
                assert_delta_on(store.path(f"step-{step}", f"__{rank}_0.distcp"),
                                store.path(f"step-{step - 100}", f"__{rank}_0.distcp"))
        r = subprocess.run([CKPTFS, "umount", node_b], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
    finally:
        force_unmount(node_b)
    store.umount()
    assert store.cli("fsck", store.backing, check=False).returncode == 0


def dcp_shard(tensors):
    """A DCP shard as FileSystemWriter writes it: one torch.save archive per
    item, back to back."""
    import io
    out = io.BytesIO()
    for t in tensors:
        buf = io.BytesIO()
        torch.save(t, buf)
        out.write(buf.getvalue())
    return out.getvalue()


def dcp_metadata(items, name="__0_0.distcp"):
    """The coordinator's .metadata for one shard of `items` [(fqn, bytes)]:
    storage_data maps each item to (relative_path, offset, length)."""
    storage, at = {}, 0
    for fqn, data in items:
        storage[(fqn, None)] = (name, at, len(data))
        at += len(data)
    return pickle.dumps({"state_dict_metadata": {}, "storage_data": storage, "planner_data": None})


def test_dcp_shards_are_parsed_named_and_chain(store):
    """step-N/__R_0.distcp (torchtitan, Megatron torch_dist): parsed as DCP,
    its tensors named by the save's .metadata (written after the shard: the
    first save's commit waits for it; later saves take the previous save's),
    weights and optimizer state within their budgets (second moments a
    per-element bound), each shard a delta on its previous one. A shard that
    no metadata ever names is stored bit for bit, and waits for none at
    unmount."""
    import io
    store.mount("lossy=on")
    model = weights(0)
    for step in (100, 200, 300, 400):
        model = weights(step, drift=model)
        d = store.path(f"step-{step}")
        os.makedirs(d)
        items = [("train_state", {"step": step})] + [(f"model.{k}", v) for k, v in model.items()]
        items += [(f"optimizer.state.model.{k}.exp_avg_sq", 1e-6 * v * v) for k, v in model.items()]
        blobs = []
        for fqn, obj in items:
            buf = io.BytesIO()
            torch.save(obj, buf)
            blobs.append((fqn, buf.getvalue()))
        data = b"".join(b for _, b in blobs)
        p = os.path.join(d, "__0_0.distcp")
        with open(p, "wb") as f:
            f.write(data)
        with open(os.path.join(d, ".metadata"), "wb") as f:  # after the shard, as the coordinator does
            f.write(dcp_metadata(blobs))
        store.wait_idle()
        assert xattr(p, "codec") == "blob:dcp+lossy", step
        with open(p, "rb") as f:
            back = f.read()
        assert len(back) == len(data)
        at = 0
        for (fqn, blob), (_, obj) in zip(blobs, items):
            got = torch.load(io.BytesIO(back[at:at + len(blob)]))
            at += len(blob)
            if not torch.is_tensor(obj):
                assert got == obj
            elif fqn.endswith("exp_avg_sq"):
                nz = obj != 0
                # Within a factor 1.45 either way (2.25 x the optimizer budget 0.2).
                ratio = got[nz].double() / obj[nz].double()
                assert torch.all(got[~nz] == 0) and float(torch.maximum(ratio, 1 / ratio).max()) <= 1.45 + 1e-6
            else:
                assert float((got - obj).norm() / obj.norm()) <= 0.0101, fqn
    for step in (200, 300, 400):
        assert_delta_on(store.path(f"step-{step}", "__0_0.distcp"), store.path(f"step-{step - 100}", "__0_0.distcp"))
    # Shards of a run whose metadata never comes: the unmount does not wait
    # for it, and they are stored bit for bit.
    os.makedirs(store.path("other", "step-1"))
    data = dcp_shard([{"step": 1}] + list(weights(7).values()))
    with open(store.path("other", "step-1", "__0_0.distcp"), "wb") as f:
        f.write(data)
    t0 = time.time()
    store.umount()
    assert time.time() - t0 < 30
    store.mount("lossy=on")
    p = store.path("other", "step-1", "__0_0.distcp")
    assert xattr(p, "codec") == "blob:dcp" and xattr(p, "error") == "lossless"
    with open(p, "rb") as f:
        assert f.read() == data


def deepspeed_save(store, step, model, moments):
    """DeepSpeed ZeRO-2 with two ranks, as its save_checkpoint writes them:
    the model file, then each rank's optimizer file holding its half of the
    flattened fp32 weights and Adam's state of the same elements; no wait
    between the files (the daemon orders their commits)."""
    d = store.path(f"global_step{step}")
    os.makedirs(d, exist_ok=True)
    torch.save({"module": model, "global_steps": step}, os.path.join(d, "mp_rank_00_model_states.pt"))
    flat = torch.cat([v.reshape(-1) for v in model.values()])
    half = flat.numel() // 2
    for r, sl in enumerate((slice(0, half), slice(half, flat.numel()))):
        torch.save({"optimizer_state_dict": {
            "base_optimizer_state": [{"step": torch.tensor(float(step)), "exp_avg": moments[0][sl].clone(),
                                      "exp_avg_sq": moments[1][sl].clone()}],
            "single_partition_of_fp32_groups": [flat[sl].clone()], "zero_stage": 2}},
            os.path.join(d, f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt"))
    return flat


def test_deepspeed_optimizer_files_are_ref_copies_of_the_model_file(store):
    """DeepSpeed's optimizer files repeat the model file's fp32 weights
    (flattened, split between ranks): each rank's flat weights are coded as
    ref copies of the model file's blob of the same save (codec/FORMAT.md
    "Step prediction", ref copies), cost a small part of what the model's
    weights cost, and read back within budget after the model files are
    deleted, `gc` ran and the store was remounted (a ref keeps its blob)."""
    g = torch.Generator().manual_seed(11)
    model = {"fc1.weight": 0.05 * torch.randn(1024, 384, generator=g), "fc1.bias": torch.zeros(1024),
             "fc2.weight": 0.05 * torch.randn(384, 1024, generator=g), "fc2.bias": 0.01 * torch.randn(384, generator=g)}
    n = sum(v.numel() for v in model.values())
    moments = [1e-4 * torch.randn(n, generator=g), 1e-8 * torch.rand(n, generator=g)]
    store.mount("lossy=on")
    flats = {}
    for step in (100, 200, 300):
        model = {k: v + 1e-3 * torch.randn(v.shape, generator=g) for k, v in model.items()}
        moments = [0.9 * moments[0] + 1e-5 * torch.randn(n, generator=g), 0.999 * moments[1] + 1e-9]
        flats[step] = deepspeed_save(store, step, model, moments)
        store.wait_idle()
    for step in (100, 200, 300):
        model_file = store.path(f"global_step{step}", "mp_rank_00_model_states.pt")
        info = json.loads(store.cli("inspect", "--json", os.path.join(
            store.backing, f"global_step{step}", "mp_rank_00_model_states.pt")).stdout)["blob"]
        weights_bytes = sum(t["stored_bytes"] for t in info["tensors"] if t["name"].startswith("module."))
        for r in (0, 1):
            rel = os.path.join(f"global_step{step}", f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt")
            blob = json.loads(store.cli("inspect", "--json", os.path.join(store.backing, rel)).stdout)["blob"]
            assert blob.get("ref") == xattr(model_file, "object"), (rel, blob.get("ref"))
            flat = {t["name"]: t for t in blob["tensors"]}["optimizer_state_dict.single_partition_of_fp32_groups.0"]
            assert flat["lossy"].get("ref_copy_chunks", 0) >= 1, (rel, flat)
            assert flat["stored_bytes"] < 0.2 * weights_bytes / 2, (rel, flat["stored_bytes"], weights_bytes)
            if step > 100:  # the rank's previous file is its base
                assert base_of(store.path(rel)) == xattr(store.path(
                    f"global_step{step - 100}", f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt"), "object")
    # The model files gone and collected: the optimizer files still read.
    for step in (100, 200, 300):
        os.remove(store.path(f"global_step{step}", "mp_rank_00_model_states.pt"))
    store.wait_idle()
    store.umount()
    r = store.cli("gc", store.backing, "--grace", "0")
    assert r.returncode == 0, r.stderr
    store.mount("lossy=on")
    for step in (100, 200, 300):
        got = [torch.load(store.path(f"global_step{step}", f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt"))
               for r in (0, 1)]
        flat = torch.cat([s["optimizer_state_dict"]["single_partition_of_fp32_groups"][0] for s in got])
        err = float((flat.double() - flats[step].double()).norm() / flats[step].double().norm())
        assert err <= 0.01 + 1e-6, (step, err)
    store.umount()
    r = store.cli("fsck", store.backing)
    assert r.returncode == 0, r.stdout + r.stderr
