"""Reduced eval run (scripts/eval) through a real ckptfs mount: a tiny digits
CNN, 30 steps, 2 restore-and-resume cycles.

- lossless: the resumed run ends bit-identical to the uninterrupted one on a
  plain directory, and the store is smaller than the data (ratio > 1);
- lossy (only when the mount accepts -o lossy=on,budget=...): ratio > 5 and
  accuracy at most 25 points below the baseline (seed noise is ~20 here);
- exp_compression.py end to end: JSON, markdown and plot, with a backend the
  mount rejects reported as "not run";
- exp_fault_tolerance.py with two seeds per backend;
- exp_restore_damage.py: each restore's effect right after it and a
  horizon later, nothing at all for lossless; state_bias.py's gains of the
  optimizer state, exactly 1 for lossless;
- the workloads nothing was tuned on (resnet, finetune-bf16): what their
  checkpoints hold, and a bit-identical lossless resume through a mount;
- the hand-written safetensors writer/reader (no mount needed).

The binary comes from $CKPTFS_BIN (default build/mount-tools/ckptfs). Every
mount is unmounted in teardown (ckptfs umount, then fusermount3 -uz).
"""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("sklearn")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EVAL = os.path.join(REPO, "scripts", "eval")
sys.path.insert(0, EVAL)

import backends as bk  # noqa: E402
import harness as h  # noqa: E402

LOSSY = "ckptfs-lossy:1e-2"


def _mounts_under(root):
    root = os.path.realpath(root)
    with open("/proc/self/mounts") as f:
        return [line.split()[1] for line in f if line.split()[1].startswith(root + "/")]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    why = bk.fuse_problem()
    if why:
        pytest.skip(f"FUSE unavailable: {why}")
    d = tmp_path_factory.mktemp("eval")
    try:
        yield str(d)
    finally:
        for m in _mounts_under(str(d)):
            bk.force_unmount(m)


@pytest.fixture(scope="module")
def baseline(workdir):
    return h.baseline_run(workdir, "digits", "smoke", 0)


def _ratio(stats):
    files = [s for p, s in stats.items() if p.startswith("ckpts/")]
    assert files, f"no checkpoint files in the store: {sorted(stats)}"
    return sum(s["logical_bytes"] for s in files) / sum(s["stored_bytes"] for s in files)


def test_lossless_resume_is_bit_identical_and_compresses(workdir, baseline):
    b = bk.make("ckptfs-lossless")
    why = bk.probe_lossless_options(b, os.path.join(workdir, "probe-lossless"))
    assert why is None, f"lossless mount failed: {why}"
    r = h.resumed_run(b, os.path.join(workdir, "lossless"), "digits", "smoke", 0)
    assert r["restores"] == 2
    identical, max_diff = h.compare_states(baseline["final"], r["final"])
    assert identical, f"lossless resume differs from the uninterrupted run (max |diff| {max_diff})"
    assert len([p for p in r["stats"] if p.endswith(".pt")]) == 6
    assert _ratio(r["stats"]) > 1.0


def test_lossy_resume_compresses_and_keeps_accuracy(workdir, baseline):
    b = bk.make(LOSSY)
    why = b.probe(os.path.join(workdir, "probe-lossy"))
    if why:
        pytest.skip(f"the mount does not accept lossy options yet: {why}")
    r = h.resumed_run(b, os.path.join(workdir, "lossy"), "digits", "smoke", 0)
    assert r["restores"] == 2
    ratio = _ratio(r["stats"])
    # Adam's exp_avg_sq is never pruned (a zeroed second moment makes the
    # next step explode): it is stored in log mode with a per-element
    # relative bound, at a lower ratio than the L2-budget tensors.
    assert ratio > 2, f"lossy ratio {ratio:.2f}"
    import torch
    want = torch.load(baseline["final"])["eval"]
    got = torch.load(r["final"])["eval"]
    assert got["loss"] == got["loss"], "loss is NaN after lossy restores"
    # Loose: after 30 steps of the tiny model the three seeds' accuracies
    # span ~20 points (17-36 %), so this only catches a broken restore
    # (chance is 10 %); the full-size experiments measure the real effect.
    assert got["accuracy"] >= want["accuracy"] - 0.25, (got, want)


def test_compression_experiment_writes_results(workdir, baseline, tmp_path):
    results = tmp_path / "results"
    r = subprocess.run([h.PYTHON, os.path.join(EVAL, "exp_compression.py"), "--workload", "digits",
                        "--size", "smoke", "--backends", f"ckptfs-lossless,{LOSSY}", "--workdir", workdir,
                        "--results", str(results)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    with open(results / "compression-digits.json") as f:
        res = json.load(f)
    zstd = next(v for k, v in res["backends"].items() if k.startswith("zstd"))
    assert zstd["status"] == "ok" and len(zstd["per_checkpoint"]) == 6
    lossless = res["backends"]["ckptfs-lossless"]
    assert lossless["status"] == "ok"
    assert lossless["summary"]["checkpoint"]["ratio"] > 1.0
    assert set(lossless["summary"]) >= {"checkpoint", "weights", "optimizer", "weights+optimizer"}
    lossy = res["backends"][LOSSY]
    assert lossy["status"] in ("ok", "not run")
    if lossy["status"] == "not run":
        assert lossy["reason"]
    md = (results / "compression-digits.md").read_text()
    assert "ckptfs-lossless" in md and LOSSY in md
    assert (results / "compression-digits.png").stat().st_size > 1000


def test_fault_experiment_with_several_seeds(workdir, tmp_path):
    """--seeds 0,3: each seed resumes from its own store and is compared with
    the uninterrupted run of the same seed (seeds past 0-2 get their own
    baseline); lossless ends bit-identical for both, and the summary line
    gives their mean."""
    results = tmp_path / "results"
    r = subprocess.run([h.PYTHON, os.path.join(EVAL, "exp_fault_tolerance.py"), "--workload", "digits",
                        "--size", "smoke", "--seeds", "0,3", "--backends", "ckptfs-lossless", "--workdir", workdir,
                        "--results", str(results)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    with open(results / "fault-digits.json") as f:
        b = json.load(f)["backends"]["ckptfs-lossless"]
    assert sorted(b["per_seed"]) == ["seed0", "seed3"]
    for seed, p in b["per_seed"].items():
        assert p["bit_identical"] and p["restores"] == 2, (seed, p)
    # Seed 3 is its own run (another trajectory), not seed 0's again.
    assert b["per_seed"]["seed3"]["final"] != b["per_seed"]["seed0"]["final"]
    assert b["per_seed_summary"]["mean"] == 0.0 and b["per_seed_summary"]["all_within_target"]
    md = (results / "fault-digits.md").read_text()
    assert "ckptfs-lossless, seed3" in md and "over seeds 0, 3" in md
    assert "spread of the baseline (seeds 0,1,2,3)" in md
    # Seeds are distinct numbers of 0-99.
    for seeds in ("0,100", "1,1", "0,x"):
        bad = subprocess.run([h.PYTHON, os.path.join(EVAL, "exp_fault_tolerance.py"), "--workload", "digits",
                              "--size", "smoke", "--seeds", seeds, "--backends", "ckptfs-lossless", "--workdir",
                              workdir, "--results", str(results)], capture_output=True, text=True, timeout=600)
        assert bad.returncode != 0 and "--seeds" in bad.stderr, seeds


def test_restore_damage_experiment(workdir, baseline, tmp_path):
    """exp_restore_damage.py: every checkpoint read back from the store,
    evaluated at once and resumed for a horizon; a lossless store differs by
    nothing, a lossy one and the white-noise control move the eval loss (the
    measure is not blind), and a horizon off the save interval is refused."""
    results = tmp_path / "results"
    r = subprocess.run([h.PYTHON, os.path.join(EVAL, "exp_restore_damage.py"), "--workload", "digits",
                        "--size", "smoke", "--backends", f"ckptfs-lossless,{LOSSY}", "--noise", "1e-2",
                        "--oracle-gains", "--workdir", workdir, "--results", str(results)],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr
    with open(results / "damage-digits.json") as f:
        res = json.load(f)
    sched = h.schedule("digits", "smoke")
    assert res["horizon"] == sched["restore_every"] and res["checkpoints"] == 6
    lossless = res["backends"]["ckptfs-lossless"]
    assert lossless["status"] == "ok" and len(lossless["per_checkpoint"]) == 6
    resumable = [c for c in lossless["per_checkpoint"] if c["step"] + res["horizon"] <= sched["steps"]]
    assert all("resumed" in c for c in resumable) and len(resumable) == 4
    for c in lossless["per_checkpoint"]:
        assert c["restored"] == c["original"], c
        if "resumed" in c:
            assert c["resumed"] == c["uninterrupted"], c
    lossy = res["backends"][LOSSY]
    assert lossy["status"] == "ok" and lossy["ratio"] > 2
    assert lossy["summary"]["right_after"]["loss_pct"]["mean_abs"] > 0, "a lossy restore that changed nothing"
    assert lossy["summary"]["after_horizon"]["restores"] == 4
    # The oracle: the lossy store's checkpoints with Adam's moments unbiased
    # (not for lossless, whose state has no bias to remove).
    oracle = res["backends"][f"{LOSSY} (oracle gains)"]
    assert oracle["ratio"] == lossy["ratio"] and len(oracle["per_checkpoint"]) == 6
    assert "ckptfs-lossless (oracle gains)" not in res["backends"]
    # The control: white noise of rel_l2 1e-2 on the model, no store.
    noise = res["backends"]["noise:0.01"]
    assert noise["ratio"] is None and len(noise["per_checkpoint"]) == 6
    assert noise["summary"]["right_after"]["loss_pct"]["mean_abs"] > 0
    md = (results / "damage-digits.md").read_text()
    assert "ckptfs-lossless" in md and LOSSY in md and "noise:0.01" in md
    bad = subprocess.run([h.PYTHON, os.path.join(EVAL, "exp_restore_damage.py"), "--workload", "digits",
                          "--size", "smoke", "--horizon", "7", "--backends", "ckptfs-lossless", "--workdir", workdir,
                          "--results", str(results)], capture_output=True, text=True, timeout=600)
    assert bad.returncode != 0 and "--horizon" in bad.stderr


def test_state_bias_is_none_when_lossless(baseline):
    """state_bias.py: the optimizer state of a lossless chain comes back with
    gains of exactly 1 and no log ratio; a lossy one differs (the measure
    sees it)."""
    def run(budget):
        r = subprocess.run([h.PYTHON, os.path.join(EVAL, "state_bias.py"), baseline["ckpts"], "--count", "3",
                            "--budget", budget, "--json"], capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)
    lossless = run("0")
    assert [row["chain_depth"] for row in lossless["checkpoints"]] == [0, 1, 2]
    for row in lossless["checkpoints"]:
        assert row["m_gain"] == 1.0 and row["step_gain"] == 1.0 and row["v_log_ratio"] == 0.0, row
    lossy = run("0.01")
    rows = lossy["checkpoints"]
    assert any(row["m_gain"] != 1.0 for row in rows) and all(0.0 < row["m_gain"] < 2.0 for row in rows)
    assert lossy["ratio"] > lossless["ratio"] > 1.0


def test_safetensors_writer_layout(tmp_path):
    """The hand-written safetensors of the charlm workload: u64 LE header
    length, a JSON header padded with spaces to a multiple of 8, contiguous
    data in key order; read back equal, including 0-d and empty tensors."""
    import struct

    import torch
    import common
    tensors = {"b.weight": torch.randn(3, 5), "a.bias": torch.arange(7, dtype=torch.float16),
               "c.scale": torch.tensor(2.5, dtype=torch.bfloat16), "d.empty": torch.zeros(0, 4),
               "e.ids": torch.arange(4, dtype=torch.int64)}
    path = str(tmp_path / "m.safetensors")
    common.save_safetensors(tensors, path)
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    assert n % 8 == 0 and 8 + n <= len(data)
    text = data[8:8 + n]
    assert text.rstrip(b" ").endswith(b"}") and set(text[len(text.rstrip(b" ")):]) <= {ord(" ")}
    header = json.loads(text)
    end = 0
    for name in sorted(tensors):
        a, b = header[name]["data_offsets"]
        assert a == end and b - a == tensors[name].numel() * tensors[name].element_size()
        end = b
    assert 8 + n + end == len(data)
    assert header["c.scale"] == {"dtype": "BF16", "shape": [], "data_offsets": header["c.scale"]["data_offsets"]}
    back = common.load_safetensors(path)
    for name, t in tensors.items():
        assert back[name].dtype == t.dtype and back[name].shape == t.shape and torch.equal(back[name], t)


def test_safetensors_reader_agrees_with_format_fixture():
    """Our reader parses the repository's safetensors fixture into the
    tensors its description lists (names, dtypes, shapes)."""
    import common
    fixture = os.path.join(REPO, "tests", "data", "formats", "model.safetensors")
    if not os.path.exists(fixture):
        pytest.skip("format fixture missing")
    with open(fixture + ".json") as f:
        want = json.load(f)["tensors"]
    got = common.load_safetensors(fixture)
    names = {"bf16": "torch.bfloat16", "f32": "torch.float32", "f16": "torch.float16"}
    assert sorted(got) == sorted(t["name"] for t in want)
    for t in want:
        assert str(got[t["name"]].dtype) == names[t["dtype"]]
        assert list(got[t["name"]].shape) == t["shape"]


def test_compare_states_sees_one_ulp(tmp_path):
    """The bit-identity check of the fault-tolerance experiment catches a
    one-ulp change in one optimizer element, and -0.0 vs 0.0."""
    import torch
    state = {"model": {"w": torch.randn(4, 4), "b": torch.zeros(4)},
             "optimizer": {"state": {0: {"exp_avg": torch.randn(4, 4), "step": torch.tensor(3.0)}},
                           "param_groups": [{"lr": 1e-3, "params": [0]}]}}
    a, b, c = (str(tmp_path / n) for n in ("a.pt", "b.pt", "c.pt"))
    torch.save(state, a)
    assert h.compare_states(a, a) == (True, 0.0)
    ea = state["optimizer"]["state"][0]["exp_avg"]
    ea.view(torch.int32)[1, 2] += 1
    torch.save(state, b)
    same, diff = h.compare_states(a, b)
    assert not same and 0 < diff < 1e-6
    ea.view(torch.int32)[1, 2] -= 1
    state["model"]["b"][0] = -0.0
    torch.save(state, c)
    assert h.compare_states(a, c)[0] is False


@pytest.mark.parametrize("workload", ["resnet", "finetune-bf16"])
def test_untuned_workloads_resume_bit_identical_through_the_mount(workdir, workload):
    """The two workloads nothing was tuned on (a ResNet with batch norm and
    SGD + Nesterov momentum; a bf16 fine-tune with fp32 masters and AdamW
    state) hold what their docs say, and a lossless mount resumes them
    bit-identical to the uninterrupted run (the fine-tune also reads its
    pretrained checkpoint back from the mount)."""
    import torch
    base = h.baseline_run(workdir, workload, "smoke", 0)
    ckpt = torch.load(os.path.join(base["ckpts"], "ckpt_000005.pt"))
    model, opt = ckpt["model"], ckpt["optimizer"]
    if workload == "resnet":
        assert any(k.endswith("running_var") for k in model)
        assert any(k.endswith("num_batches_tracked") for k in model)
        assert all("momentum_buffer" in s for s in opt["state"].values())
        assert opt["param_groups"][0]["nesterov"]
    else:
        assert {v.dtype for v in model.values()} == {torch.bfloat16}
        masters = opt["fp32_master"]
        assert len(masters) == len(opt["state"]) and masters[0].dtype == torch.float32
        assert {s["exp_avg"].dtype for s in opt["state"].values()} == {torch.float32}
        # The weights are the masters rounded to bf16, and they moved.
        assert torch.equal(model["tok.weight"], masters[0].to(torch.bfloat16))
        pretrained = torch.load(h.pretrained_checkpoint(workdir, workload, "smoke"))["model"]
        assert not torch.equal(model["tok.weight"], pretrained["tok.weight"].to(torch.bfloat16))
    b = bk.make("ckptfs-lossless")
    init = h.pretrained_checkpoint(workdir, workload, "smoke")
    r = h.resumed_run(b, os.path.join(workdir, f"lossless-{workload}"), workload, "smoke", 0, init_source=init)
    assert r["restores"] == 2
    identical, max_diff = h.compare_states(base["final"], r["final"])
    assert identical, f"{workload}: lossless resume differs from the uninterrupted run (max |diff| {max_diff})"
