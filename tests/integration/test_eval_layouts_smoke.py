"""scripts/eval/exp_layouts.py --size smoke end to end through real ckptfs
mounts (issue #24): the tiny run replayed once per framework layout with
-o lossy=off.

Asserts that every layout ran, that fsck was clean after gc, that every
retained file read back bit for bit after a remount, what each layout
retained (renames, in-place rewrites, copies and deletions as the framework
does them) and that every version was committed. It asserts no compression
ratio: the daemon's base choice across folders is being changed, and the
smoke files are too small for ratios to mean much.

The binary comes from $CKPTFS_BIN (default build/mount-tools/ckptfs). The
script unmounts its mounts itself; any left under tmp_path are unmounted in
teardown (ckptfs umount, then fusermount3 -uz).
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

SCRIPT = os.path.join(EVAL, "exp_layouts.py")
LAYOUTS = ["one-folder", "hf-trainer", "hf-safetensors", "megatron", "megatron-tp2", "deepspeed", "dcp",
           "lightning", "lightning-all", "one-folder-keep1", "one-folder-keep3", "hf-trainer-keep3", "copy"]
# Files each layout leaves after the 4 smoke checkpoints (steps 10..40).
RETAINED = {"one-folder": 4, "hf-trainer": 20, "hf-safetensors": 20, "megatron": 5, "megatron-tp2": 9,
            "deepspeed": 13, "dcp": 12, "lightning": 2, "lightning-all": 5, "one-folder-keep1": 1,
            "one-folder-keep3": 3, "hf-trainer-keep3": 15, "copy": 3}


def _mounts_under(root):
    root = os.path.realpath(root)
    with open("/proc/self/mounts") as f:
        return [line.split()[1] for line in f if line.split()[1].startswith(root + "/")]


@pytest.fixture
def workdir(tmp_path):
    why = bk.fuse_problem()
    if why:
        pytest.skip(f"FUSE unavailable: {why}")
    try:
        yield tmp_path
    finally:
        for m in _mounts_under(str(tmp_path)):
            bk.force_unmount(m)


def test_layouts_smoke_lossless(workdir):
    results = workdir / "results"
    r = subprocess.run([h.PYTHON, SCRIPT, "--size", "smoke", "--lossy", "off", "--layouts", ",".join(LAYOUTS),
                        "--workdir", str(workdir / "work"), "--results", str(results)],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-5000:]
    assert not _mounts_under(str(workdir)), "the script left a mount behind"
    # A lossless run writes layouts-lossless.{json,md} (the lossy one layouts.*).
    with open(results / "layouts-lossless.json") as f:
        res = json.load(f)
    assert json.loads(r.stdout) == res
    assert res["lossy"] == "off" and "lossy=off" in res["mount_options"]
    assert res["run"]["checkpoints"] == 4
    assert list(res["layouts"]) == LAYOUTS
    for name, lay in res["layouts"].items():
        assert lay["status"] == "ok", (name, lay.get("reason"))
        assert lay["fsck"]["clean"] and lay["fsck"]["exit"] == 0, (name, lay["fsck"])
        read = lay["read"]
        assert read["ok"] and read["bit_exact"], (name, read["problems"])
        assert read["tensors"] > 0 and read["bit_exact_tensors"] == read["tensors"], (name, read)
        assert read["files"] == lay["retained_files"] == RETAINED[name], (name, read["files"], lay["retained_files"])
        assert lay["uncommitted_versions"] == 0, name
        assert lay["logical_bytes"] > 0 and lay["store_bytes"] > 0 and lay["ratio"] > 0
        v = lay["versions"]
        assert v["versions"] == v["delta"] + v["key"] > 0, (name, v)
    # Deleted versions still count: the keep-3 layouts recorded all 4 saves.
    assert res["layouts"]["one-folder-keep3"]["per_file"]["run/ckpt-N.pt"]["versions"] == 4
    assert res["layouts"]["hf-trainer-keep3"]["per_file"]["run/checkpoint-N/optimizer.pt"]["versions"] == 4
    # last.ckpt is rewritten at every save, the epoch= file replaced.
    assert res["layouts"]["lightning"]["per_file"]["run/checkpoints/last.ckpt"]["versions"] == 4
    copy = res["layouts"]["copy"]["copy"]
    for label in ("same_folder", "other_folder"):
        assert copy[label]["growth_pct"] == pytest.approx(100 * copy[label]["store_growth_bytes"] / copy["file_bytes"])
    assert "retention" in res and res["retention"]["store_quotient"] > 0
    assert all(isinstance(ok, bool) for ok in res["targets"].values())
    # Each layout is compared with one-folder under the same retention.
    assert res["layouts"]["lightning"]["compared_with"] == "one-folder-keep1"
    assert res["layouts"]["hf-trainer-keep3"]["compared_with"] == "one-folder-keep3"
    assert res["layouts"]["lightning-all"]["compared_with"] == "one-folder"
    md = (results / "layouts-lossless.md").read_text()
    for name in LAYOUTS:
        assert f"| {name} |" in md
    assert "Retention" in md and "Byte-identical copies" in md


def test_layouts_rejects_unknown_layout(tmp_path):
    r = subprocess.run([h.PYTHON, SCRIPT, "--size", "smoke", "--layouts", "one-folder,nonesuch",
                        "--workdir", str(tmp_path / "work"), "--results", str(tmp_path / "results")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "nonesuch" in r.stderr
    assert not (tmp_path / "results").exists()
