"""Lossy storage through the mount: torch checkpoints within their budget."""
import copy
import json
import os
import shutil
import subprocess
import time

import pytest

torch = pytest.importorskip("torch")
torch.set_num_threads(2)

from test_fs_torch import assert_same, model_state  # noqa: E402

EPS = 1e-6


def rel_l2(got, want):
    want = want.double()
    n = want.norm()
    return float((got.double() - want).norm() / n) if n > 0 else float((got.double() - want).norm())


# The mount's default budget of optimizer state when only budget= (below 0.2)
# is given (docs/policy.md).
DEFAULT_OPT_BUDGET = 0.2
# Adam's exp_avg in step space (the default momentum=step): its budget is
# on m / (sqrt(v_hat) + eps), 2.5 times the optimizer budget, for f32
# tensors of at least 4096 elements (codec/FORMAT.md "Step space").
MOMENTUM_STEP_FACTOR = 2.5
STEP_SPACE_MIN_ELEMENTS = 4096
# First moments (exp_avg, momentum_buffer) come back unbiased: their levels'
# gain may raise the error to this multiple of their budget (docs/policy.md).
UNBIAS_ALLOWANCE = 1.25
# Update denominators (exp_avg_sq) are stored in log mode, every element
# within a factor 1 + this times the optimizer budget either way (docs/policy.md).
DENOMINATOR_FACTOR = 2.25


def max_rel_error(got, want):
    """Largest factor - 1 between got and want (either way) over the
    positive elements; the others (zeros, negatives, non-finite) must come
    back exactly."""
    got, want = got.double(), want.double()
    pos = want > 0
    assert torch.equal(got[~pos], want[~pos])
    if not pos.any():
        return 0.0
    ratio = got[pos] / want[pos]
    return float(torch.maximum(ratio, 1 / ratio).max()) - 1.0


def step_space_error(got_m, want_m, got_v):
    s = got_v.double().sqrt() + 1e-8
    return rel_l2(got_m.double() / s, want_m.double() / s)


def check_within(got, want, budget, opt_budget=None, path="", step_space=True):
    """Float tensors within budget (same dtype/shape), everything else exact.
    With `step_space`, an Adam exp_avg that the default codes in step space
    is checked on the step instead (against the exp_avg_sq read back)."""
    if isinstance(want, dict) and step_space and opt_budget is not None and "exp_avg" in want and \
            "exp_avg_sq" in want and want["exp_avg"].dtype == torch.float32 and \
            want["exp_avg_sq"].dtype == torch.float32 and want["exp_avg"].numel() >= STEP_SPACE_MIN_ELEMENTS:
        err = step_space_error(got["exp_avg"], want["exp_avg"], got["exp_avg_sq"])
        b = min(1.0, MOMENTUM_STEP_FACTOR * opt_budget) * UNBIAS_ALLOWANCE
        assert err <= b + EPS, f"{path}.exp_avg: rel_l2 on the step {err} > {b}"
        rest = {k: v for k, v in want.items() if k != "exp_avg"}
        assert got.keys() == want.keys(), path
        return check_within({k: got[k] for k in rest}, rest, budget, opt_budget, path, step_space)
    if isinstance(want, torch.Tensor):
        assert got.dtype == want.dtype and got.shape == want.shape, path
        if want.is_floating_point() and opt_budget is not None and path.startswith("optimizer.state") and \
                path.endswith(".exp_avg_sq"):
            b = min(1.0, DENOMINATOR_FACTOR * opt_budget)
            err = max_rel_error(got, want)
            assert err <= b + EPS, f"{path}: max relative error {err} > {b}"
        elif want.is_floating_point():
            b = opt_budget if (opt_budget is not None and path.startswith("optimizer.state")) else budget
            if opt_budget is not None and path.startswith("optimizer.state") and \
                    (path.endswith(".exp_avg") or path.endswith(".momentum_buffer")):
                b *= UNBIAS_ALLOWANCE
            err = rel_l2(got, want)
            assert err <= b + EPS, f"{path}: rel_l2 {err} > {b}"
        else:
            assert torch.equal(got, want), path
    elif isinstance(want, dict):
        assert got.keys() == want.keys(), path
        for k in want:
            check_within(got[k], want[k], budget, opt_budget, f"{path}.{k}" if path else str(k), step_space)
    else:
        assert got == want, path


def zip_ok(path):
    r = subprocess.run(["/usr/bin/python3", "-m", "zipfile", "-t", path], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    if shutil.which("unzip"):
        r = subprocess.run(["unzip", "-tq", path], capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr


def xattr(path, name):
    return os.getxattr(path, "user.ckptfs." + name).decode()


def wait_committed(store, *paths, timeout=60):
    """Waits until every path is committed: FUSE sends RELEASE after close()
    returns, so an idle queue alone does not prove the commit was queued."""
    deadline = time.time() + timeout
    for p in paths:
        while xattr(p, "state") != "committed":
            assert time.time() < deadline, f"{p} not committed"
            time.sleep(0.02)
    store.wait_idle()


def test_lossy_torch_within_budget(store, tmp_path):
    store.mount("lossy=on,budget=0.01,opt_budget=0.05")
    sd = model_state(1)
    p = store.path("ckpt.pt")
    torch.save(sd, p)
    wait_committed(store, p)
    ref = tmp_path / "ckpt.pt"
    torch.save(sd, ref)
    assert os.path.getsize(p) == os.path.getsize(ref)
    with open(p, "rb") as f:
        data = f.read()
    assert data != ref.read_bytes()  # lossy: the floats changed
    zip_ok(p)
    got = torch.load(p)
    check_within(got, sd, 0.01, 0.05)
    assert torch.equal(got["model"]["steps"], sd["model"]["steps"])
    assert "+lossy" in xattr(p, "codec")
    err = float(xattr(p, "error"))
    assert 0 < err <= 0.05 + EPS
    lossy_stored = int(xattr(p, "stored_bytes"))

    # The same file lossless for comparison.
    q = store.path("exact.pt")
    store.umount()
    store.mount("lossy=off")
    torch.save(sd, q)
    wait_committed(store, q)
    assert xattr(q, "error") == "lossless"
    assert_same(torch.load(q), sd)
    lossless_stored = int(xattr(q, "stored_bytes"))
    assert lossy_stored * 2 < lossless_stored, (lossy_stored, lossless_stored)
    # The lossy file still reads the same after the remount.
    check_within(torch.load(p), sd, 0.01, 0.05)


def test_lossless_policy_is_bit_exact(store, tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text('[[rule]]\nfiles = "exact-*.pt"\nmode = "lossless"\n\n'
                      '[[rule]]\nfiles = "*.pt"\ntensors = "model.fc1.*"\nmode = "lossy"\nrel_l2 = 0.02\n')
    store.mount(f"lossy=on,policy={policy}")
    sd = model_state(2)
    torch.save(sd, store.path("exact-1.pt"))
    wait_committed(store, store.path("exact-1.pt"))
    ref = tmp_path / "exact-1.pt"
    torch.save(sd, ref)
    with open(store.path("exact-1.pt"), "rb") as f:
        assert f.read() == ref.read_bytes()
    assert xattr(store.path("exact-1.pt"), "error") == "lossless"
    # Different content in its own directory: an identical file would be
    # stored as a (smaller, exact) delta against exact-1.pt.
    os.makedirs(store.path("sub"))
    sd = model_state(4)
    torch.save(sd, store.path("sub", "mixed.pt"))
    wait_committed(store, store.path("sub", "mixed.pt"))
    got = torch.load(store.path("sub", "mixed.pt"))
    zip_ok(store.path("sub", "mixed.pt"))
    check_within(got, sd, 0.02, DEFAULT_OPT_BUDGET)
    assert not torch.equal(got["model"]["fc1.weight"], sd["model"]["fc1.weight"])
    # Tensors outside the rule fall to the defaults (1e-2).
    check_within(got["model"]["emb"], sd["model"]["emb"], 0.01)


def test_lossy_rotation_closed_loop(store):
    store.mount("lossy=on,budget=0.01")
    d = store.path("run")
    os.makedirs(d)
    state = model_state(3)
    saved = []
    for step in range(5):
        state = model_state(200 + step, drift=1e-3, base=state)
        name = os.path.join(d, f"ckpt-{step}.pt")
        torch.save(state, name)
        wait_committed(store, name)
        saved.append((name, state))
    depths = [int(xattr(n, "chain_depth")) for n, _ in saved]
    assert max(depths) > 0, depths  # lossy deltas against the previous versions
    for name, sd in saved:
        zip_ok(name)
        check_within(torch.load(name), sd, 0.01, DEFAULT_OPT_BUDGET)
    r = store.cli("inspect", os.path.join(store.backing, "run", "ckpt-4.pt"))
    assert "rel_l2" in r.stdout, r.stdout
    # budget=0.01 alone: the weights get it, the optimizer state the default floor.
    r = store.cli("inspect", os.path.join(store.backing, "run", "ckpt-0.pt"), "--json")
    budgets = {t["name"]: t["lossy"]["budget_rel_l2"] for t in json.loads(r.stdout)["blob"]["tensors"] if "lossy" in t}
    assert budgets["model.fc1.weight"] == 0.01, budgets
    assert budgets["optimizer.state.0.exp_avg"] == DEFAULT_OPT_BUDGET, budgets


def save_versions(store, states, check=True):
    """Saves `states` as run/ckpt-N.pt one after the other (each a delta
    against the previous), checks (with `check`) the last reads back within
    the 1e-2 default budgets, and returns its tensors from `ckptfs inspect
    --json`."""
    d = store.path("run")
    os.makedirs(d)
    for step, state in enumerate(states):
        name = os.path.join(d, f"ckpt-{step}.pt")
        torch.save(state, name)
        wait_committed(store, name)
    assert int(xattr(name, "chain_depth")) > 0
    if check:
        check_within(torch.load(name), states[-1], 0.01, DEFAULT_OPT_BUDGET)
    r = store.cli("inspect", "--json", os.path.join(store.backing, "run", f"ckpt-{len(states) - 1}.pt"))
    return {t["name"]: t for t in json.loads(r.stdout)["blob"]["tensors"]}


def test_dsq_schedule_tightens_the_budget_of_small_updates(store):
    store.mount("lossy=on,budget=0.01,schedule=dsq")
    first = model_state(5)
    tensors = save_versions(store, [first, model_state(301, drift=1e-3, base=first)])  # an update far below the budget
    w = tensors["model.fc1.weight"]["lossy"]
    assert 0 < w["update_rel"] < 0.02, w
    assert w["budget_rel_l2"] < 0.01, w  # tightened: the error follows the update
    assert w["rel_l2"] <= w["budget_rel_l2"] + EPS, w


def test_frozen_tensor_costs_almost_nothing_under_the_default_schedule(store):
    """Fine-tuning with a frozen layer: the default mount (budget schedule on)
    stores the unchanged tensor of the next version as unchanged, at its
    configured budget, instead of re-encoding it closer to itself."""
    store.mount("lossy=on")
    first = model_state(9)
    second = model_state(301, drift=1e-3, base=first)
    second["model"]["fc1.weight"] = first["model"]["fc1.weight"].clone()  # frozen
    tensors = save_versions(store, [first, second])
    frozen = tensors["model.fc1.weight"]
    assert frozen["lossy"]["budget_rel_l2"] == pytest.approx(0.01), frozen  # not tightened
    assert frozen["lossy"]["update_rel"] == 0.0, frozen
    assert frozen["stored_bytes"] < frozen["logical_bytes"] / 100, frozen  # almost nothing
    trained = tensors["model.fc1.bias"]["lossy"]
    assert trained["budget_rel_l2"] < 0.01, trained  # the schedule still works on the rest


def test_bad_lossy_options_refuse_to_mount(store, tmp_path):
    for opts in ["budget=-1", "budget=abc", "gpu=maybe", "schedule=fast", f"policy={tmp_path}/missing.toml"]:
        r = store.mount("lossy=on," + opts, check=False)
        assert r.returncode != 0, opts


def test_recovery_applies_the_policy_of_the_path(store, tmp_path):
    """A commit that crash recovery finishes is encoded as the daemon would
    have: lossy for a checkpoint under a lossy mount, not lossless."""
    store.mount("lossy=on,budget=0.01,crash_at=after_staging_manifest")
    pid = store.pid
    sd = model_state(4)
    p = store.path("ckpt.pt")
    torch.save(sd, p)  # the commit aborts once the staging manifest is durable
    store.pid = pid
    store.wait_dead()
    subprocess.run(["fusermount3", "-u", "-z", store.mnt], capture_output=True)
    store.mount("lossy=on,budget=0.01")  # recovery re-encodes it before the mount returns
    wait_committed(store, p)
    assert "+lossy" in xattr(p, "codec")
    check_within(torch.load(p), sd, 0.01, DEFAULT_OPT_BUDGET)


def adam_checkpoints(versions, steps_between=5):
    """Checkpoints of a real Adam run (a small MLP on a fixed regression
    task), each {"model", "optimizer"} after `steps_between` more steps."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                                torch.nn.ReLU(), torch.nn.Linear(256, 16))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(512, 64)
    y = torch.randn(512, 16)
    out = []
    for _ in range(versions):
        for _ in range(steps_between):
            opt.zero_grad()
            batch = torch.randint(0, 512, (64,))
            torch.nn.functional.mse_loss(model(x[batch]), y[batch]).backward()
            opt.step()
        out.append({"model": {k: v.clone() for k, v in model.state_dict().items()},
                    "optimizer": copy.deepcopy(opt.state_dict())})
    return out


def save_both_ways(store, states, other, moved, check_other=True):
    """Saves `states` with the default mount into run/ (then moved to
    `moved`) and again with the mount options `other` into run/ (checked
    within the default budgets with `check_other`); returns the last
    version's tensors of each (`ckptfs inspect --json`), the store mounted
    with the defaults again."""
    store.mount("lossy=on")
    tensors = save_versions(store, states)
    store.umount()
    store.mount("lossy=on," + other)
    shutil.move(store.path("run"), store.path(moved))
    tensors_other = save_versions(store, states, check_other)
    store.umount()
    store.mount("lossy=on")
    return tensors, tensors_other


def test_adam_first_moments_are_stored_in_step_space(store):
    """The default mount stores Adam's exp_avg as m / (sqrt(v) + eps) against
    the same checkpoint's exp_avg_sq (FORMAT.md "Step space"): its budget,
    2.5x the optimizer budget, holds on the step after a remount, and the
    same checkpoints stored with momentum=plain hold 0.2 on m instead (and
    are then far worse on the step)."""
    states = adam_checkpoints(3)
    tensors, plain = save_both_ways(store, states, "momentum=plain", "run-step")
    loaded_plain = torch.load(store.path("run", "ckpt-2.pt"))
    got = torch.load(store.path("run-step", "ckpt-2.pt"))["optimizer"]["state"]
    got_plain = loaded_plain["optimizer"]["state"]
    want = states[-1]["optimizer"]["state"]
    moments = [n for n in tensors if n.endswith(".exp_avg")]
    large = 0
    for n in moments:
        i = int(n.split(".")[2])
        m = want[i]["exp_avg"]
        if m.numel() < STEP_SPACE_MIN_ELEMENTS:
            assert "step_space_chunks" not in tensors[n].get("lossy", {}), tensors[n]
            continue
        large += 1
        assert tensors[n]["lossy"]["step_space_chunks"] > 0, tensors[n]
        assert tensors[n]["lossy"]["budget_rel_l2"] <= MOMENTUM_STEP_FACTOR * DEFAULT_OPT_BUDGET + EPS, tensors[n]
        assert "step_space_chunks" not in plain[n]["lossy"], plain[n]
        on_step = step_space_error(got[i]["exp_avg"], m, got[i]["exp_avg_sq"])
        assert on_step <= MOMENTUM_STEP_FACTOR * DEFAULT_OPT_BUDGET * UNBIAS_ALLOWANCE + EPS, (n, on_step)
        assert rel_l2(got_plain[i]["exp_avg"], m) <= DEFAULT_OPT_BUDGET * UNBIAS_ALLOWANCE + EPS, n
    assert large >= 2, moments
    # The text report says where those figures are measured.
    text = store.cli("inspect", os.path.join(store.backing, "run-step", "ckpt-2.pt")).stdout
    assert any("exp_avg " in line and "(on the step)" in line for line in text.splitlines()), text
    check_within(loaded_plain, states[-1], 0.01, DEFAULT_OPT_BUDGET, step_space=False)


def test_adam_weights_are_predicted_from_their_optimizer_state(store):
    """The default mount codes the weights of a checkpoint with Adam state
    against a prediction from that state (FORMAT.md "Step prediction"):
    smaller than with predict=off, within the same budgets, and read back
    after a remount (the prediction reads the state from the store)."""
    states = adam_checkpoints(4)
    tensors, plain = save_both_ways(store, states, "predict=off", "run-predicted")
    check_within(torch.load(store.path("run-predicted", "ckpt-3.pt")), states[-1], 0.01, DEFAULT_OPT_BUDGET)
    weights = [n for n in tensors if n.startswith("model.") and n.endswith("weight")]
    assert len(weights) == 3
    for n in weights:
        assert tensors[n]["lossy"].get("predicted_chunks", 0) > 0, tensors[n]
        assert "predicted_chunks" not in plain[n]["lossy"], plain[n]
    # The second moments (log mode) are never predicted. (Whether a first
    # moment is, against its decayed previous version, depends on how much
    # of it survives 5 steps: here little; the unit tests cover it.)
    assert not any("predicted_chunks" in t.get("lossy", {}) for n, t in tensors.items() if n.endswith(".exp_avg_sq"))
    stored = sum(tensors[n]["stored_bytes"] for n in weights)
    stored_plain = sum(plain[n]["stored_bytes"] for n in weights)
    assert stored < 0.9 * stored_plain, (stored, stored_plain)


def mixed_precision_checkpoints(versions):
    """adam_checkpoints as mixed precision saves them: the model's weights in
    bf16, the fp32 masters they are rounded from in the optimizer's state
    dict (a list in parameter order), beside Adam's moments."""
    out = []
    for state in adam_checkpoints(versions):
        masters = [v.clone() for v in state["model"].values()]
        out.append({"model": {k: v.to(torch.bfloat16) for k, v in state["model"].items()},
                    "optimizer": {**state["optimizer"], "fp32_master": masters}})
    return out


def test_bf16_weights_are_stored_as_copies_of_their_fp32_masters(store):
    """A mixed-precision checkpoint through the default mount: every bf16
    weight, in the key frame and in the deltas, is coded as a copy of its
    fp32 master in the same file (FORMAT.md "Step prediction", `copy`), costs
    a small part of what the master costs, and reads back within budget
    after a remount (the copy reads its master from the store)."""
    states = mixed_precision_checkpoints(3)
    store.mount("lossy=on")
    save_versions(store, states, check=False)
    names = list(states[0]["model"])
    for version in (0, 2):
        r = store.cli("inspect", "--json", os.path.join(store.backing, "run", f"ckpt-{version}.pt"))
        tensors = {t["name"]: t for t in json.loads(r.stdout)["blob"]["tensors"]}
        copies = masters = 0
        for i, n in enumerate(names):
            t = tensors["model." + n]
            if "lossy" not in t:  # too small to code lossily
                assert t["logical_bytes"] < 4096, (version, n, t)
                continue
            assert t["codecs"] == f"lossyx{t['lossy'].get('copy_chunks', 0)}" != "lossyx0", (version, n, t)
            copies += t["stored_bytes"]
            masters += tensors[f"optimizer.fp32_master.{i}"]["stored_bytes"]
        assert copies < 0.2 * masters, (version, copies, masters)
    store.umount()
    store.mount("lossy=on")
    got = torch.load(store.path("run", "ckpt-2.pt"))
    want = states[-1]
    for i, n in enumerate(names):
        assert got["model"][n].dtype == torch.bfloat16
        assert rel_l2(got["model"][n].float(), want["model"][n].float()) <= 0.01 + EPS, n
        assert rel_l2(got["optimizer"]["fp32_master"][i], want["optimizer"]["fp32_master"][i]) <= 0.01 + EPS, n


def test_low_rank_first_moments_through_the_mount(store):
    """With low_rank=on the matrices' exp_avg of a real Adam run are coded
    with a low-rank term (FORMAT.md "Low-rank term"): inspect shows a rank,
    the checkpoints load with torch.load after a remount within their
    budgets on the step, and the same checkpoints under the default mount
    (low_rank off) have no term."""
    states = adam_checkpoints(4)
    plain, tensors = save_both_ways(store, states, "low_rank=on", "run-plain")
    got = torch.load(store.path("run", "ckpt-3.pt"))
    want = states[-1]["optimizer"]["state"]
    ranked = [n for n in tensors if n.endswith(".exp_avg") and "low_rank" in tensors[n].get("lossy", {})]
    assert ranked, {n: t.get("lossy") for n, t in tensors.items() if n.endswith(".exp_avg")}
    for n in ranked:
        assert 1 <= tensors[n]["lossy"]["low_rank"] <= 8, tensors[n]
        assert "low_rank" not in plain[n].get("lossy", {}), plain[n]
        i = int(n.split(".")[2])
        on_step = step_space_error(got["optimizer"]["state"][i]["exp_avg"], want[i]["exp_avg"],
                                   got["optimizer"]["state"][i]["exp_avg_sq"])
        assert on_step <= MOMENTUM_STEP_FACTOR * DEFAULT_OPT_BUDGET * UNBIAS_ALLOWANCE + EPS, (n, on_step)
    check_within(got, states[-1], 0.01, DEFAULT_OPT_BUDGET)
    text = store.cli("inspect", os.path.join(store.backing, "run", "ckpt-3.pt")).stdout
    assert any("exp_avg " in line and " rank " in line for line in text.splitlines()), text


def test_trellis_through_the_mount(store):
    """With trellis=on the chunks of a real Adam run's checkpoints that have
    an L2 budget are also coded by trellis-coded quantization and kept where
    smaller (LOSSY.md section 11): inspect counts trellis chunks on the
    weights, which take fewer bytes than under the default mount, and after
    a remount torch.load gives every tensor back within the default
    budgets; the default mount writes none."""
    states = adam_checkpoints(4)
    plain, tensors = save_both_ways(store, states, "trellis=on", "run-plain")
    check_within(torch.load(store.path("run", "ckpt-3.pt")), states[-1], 0.01, DEFAULT_OPT_BUDGET)
    weights = [n for n in tensors if n.startswith("model.") and n.endswith("weight")]
    assert len(weights) == 3
    coded = [n for n in weights if tensors[n]["lossy"].get("trellis_chunks", 0) > 0]
    assert coded, {n: tensors[n]["lossy"] for n in weights}
    assert not any("trellis_chunks" in t.get("lossy", {}) for t in plain.values())
    stored = sum(tensors[n]["stored_bytes"] for n in weights)
    stored_plain = sum(plain[n]["stored_bytes"] for n in weights)
    assert stored < 0.95 * stored_plain, (stored, stored_plain)
    text = store.cli("inspect", os.path.join(store.backing, "run", "ckpt-3.pt")).stdout
    assert any(line.startswith("model.") and " trellis" in line for line in text.splitlines()), text


def test_dithered_first_moments_through_the_mount(store):
    """With momentum_dither=0.9 the exp_avg of a real Adam run's delta
    versions are coded with a subtractive dither (FORMAT.md "Dither"):
    inspect says so, and after a remount torch.load gives each of them back
    with an error on the step of about 0.9 of it, uncorrelated with the step
    (so is the default mount's error, within 0.5 before its unbiasing gain:
    before the gain it leaned against the step, -0.18 to -0.22); everything
    else keeps the default budgets."""
    states = adam_checkpoints(4)
    plain, tensors = save_both_ways(store, states, "momentum_dither=0.9", "run-plain", check_other=False)
    got = torch.load(store.path("run", "ckpt-3.pt"))
    default = torch.load(store.path("run-plain", "ckpt-3.pt"))
    want = states[-1]["optimizer"]["state"]
    dithered = [n for n in tensors if n.endswith(".exp_avg") and "dithered_chunks" in tensors[n].get("lossy", {})]
    assert dithered, {n: t.get("lossy") for n, t in tensors.items() if n.endswith(".exp_avg")}
    for n in dithered:
        assert "dithered_chunks" not in plain[n].get("lossy", {}), plain[n]
        i = int(n.split(".")[2])
        g, w, v = got["optimizer"]["state"][i]["exp_avg"], want[i]["exp_avg"], got["optimizer"]["state"][i]["exp_avg_sq"]
        on_step = step_space_error(g, w, v)
        assert 0.8 <= on_step <= 0.9 * 1.25 + EPS, (n, on_step)
        s = v.double().sqrt() + 1e-8
        x, e = w.double() / s, g.double() / s - w.double() / s
        assert abs(float((e * x).sum() / (e.norm() * x.norm()))) < 0.1, n
    # The rest of the file: the default budgets, the first moments aside.
    for i, st in want.items():
        rest = {k: t for k, t in st.items() if k != "exp_avg"}
        check_within({k: got["optimizer"]["state"][i][k] for k in rest}, rest, 0.01, DEFAULT_OPT_BUDGET,
                     f"optimizer.state.{i}")
    check_within(got["model"], states[-1]["model"], 0.01, DEFAULT_OPT_BUDGET, "model")
    # The default mount's error on the same tensors: unbiased levels
    # (LOSSY.md §4), so it no longer leans against the step.
    leans = []
    for n in dithered:
        i = int(n.split(".")[2])
        g, w, v = default["optimizer"]["state"][i]["exp_avg"], want[i]["exp_avg"], default["optimizer"]["state"][i]["exp_avg_sq"]
        s = v.double().sqrt() + 1e-8
        x, e = w.double() / s, g.double() / s - w.double() / s
        leans.append(float((e * x).sum() / (e.norm() * x.norm())))
    assert all(abs(c) < 0.05 for c in leans), leans  # -0.02 to +0.01 when written
    text = store.cli("inspect", os.path.join(store.backing, "run", "ckpt-3.pt")).stdout
    assert any("exp_avg " in line and " dithered" in line for line in text.splitlines()), text
