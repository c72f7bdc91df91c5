"""The filesystem benchmark (scripts/bench/fs_bench.py) end to end at a tiny
size: every target runs once per round, the JSON carries medians, ratios of
the medians and paired ratios, and nothing stays mounted. Timings are not
judged (the machines are shared): only that the run is complete and sane."""
import json
import os
import subprocess

import pytest

from conftest import CKPTFS, REPO, _fuse_usable

pytest.importorskip("torch")


def test_fs_bench_runs_every_target_every_round(tmp_path):
    why = _fuse_usable()
    if why:
        pytest.skip(f"FUSE unavailable: {why}")
    work = tmp_path / "work"
    work.mkdir()
    out = subprocess.run(
        ["/usr/bin/python3", os.path.join(REPO, "scripts", "bench", "fs_bench.py"), "--ckptfs", CKPTFS,
         "--work", str(work), "--dd-mib", "4", "--model-mb", "24", "--runs", "2"],
        capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)
    targets = {"disk", "ckptfs", "passthrough", "ckptfs-lossless"}
    assert set(result["raw"]) == targets
    for name, runs in result["raw"].items():
        for key in ("dd_write_s", "save_s", "committed_s", "load_s"):
            assert len(runs[key]) == 2 and all(t > 0 for t in runs[key]), (name, key, runs[key])
    for name in targets:
        assert result["medians"][name]["logical_bytes"] == result["checkpoint_bytes"]
    # Lossy float tensors store far less than the file; passthrough stores it all.
    assert result["medians"]["ckptfs"]["stored_bytes"] < result["checkpoint_bytes"] / 2
    assert result["medians"]["passthrough"]["stored_bytes"] == result["checkpoint_bytes"]
    for group in ("ratios", "paired_ratios"):
        for pair in ("ckptfs_vs_passthrough", "ckptfs_lossless_vs_passthrough"):
            assert set(result[group][pair]) == {"dd_write_s", "save_s", "load_s"}
            assert all(r > 0 for r in result[group][pair].values())
    for pair, ranges in result["paired_ratio_ranges"].items():
        for key, (low, high) in ranges.items():
            assert 0 < low <= result["paired_ratios"][pair][key] <= high, (pair, key)
    with open("/proc/self/mounts") as f:
        assert not [line for line in f if str(work) in line]


def test_codec_suite_runs_every_workload_at_smoke_size(tmp_path):
    # The suite's checkpoints at a tiny size, then the benchmark over them:
    # every workload has a key frame, delta frames, the decodes of its
    # chain, zstd beside it, per-stage times, and two thread counts.
    suite = tmp_path / "suite"
    made = subprocess.run(["/usr/bin/python3", os.path.join(REPO, "scripts", "bench", "make_suite.py"), str(suite),
                           "--size", "smoke"], capture_output=True, text=True, timeout=600)
    assert made.returncode == 0, made.stderr[-3000:]
    out = subprocess.run(
        ["/usr/bin/python3", os.path.join(REPO, "scripts", "bench", "codec_suite.py"), "--ckptfs", CKPTFS,
         "--suite", str(suite), "--runs", "1", "--threads", "1,2", "--stages", "--work", str(tmp_path)],
        capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)
    assert set(result["workloads"]) == {"mlp-init", "mlp-deep", "lm", "lm-far", "conv", "mixed", "big"}
    for name, w in result["workloads"].items():
        versions = w["versions"]
        assert versions[0]["frame"] == "key" and all(v["frame"] == "delta" for v in versions[1:]), name
        s = w["summary"]
        # Lossy checkpoints of trained models: far below zstd's size.
        assert s["ratio"] > 2 * s["zstd-3_ratio"], (name, s)
        for key in ("key_encode_MBps", "delta_encode_MBps", "decode_v1_MBps", "encode_scaling_t2",
                    "decode_scaling_t2"):
            assert s[key] and s[key] > 0, (name, key, s)
        assert "v1" in w["decodes"], name
        if len(versions) > 2:
            assert w["decodes"]["deepest"]["chain_depth"] == len(versions) - 1, name
        stages = versions[0]["stages"]
        assert stages["lossy"]["seconds"] > 0 and stages["lossy"]["chunks"] > 0, (name, stages)
        assert versions[1]["stages"]["base_read"]["chunks"] > 0, name
    tables = subprocess.run(["/usr/bin/python3", os.path.join(REPO, "scripts", "bench", "codec_suite.py"),
                             "--from-json", "/dev/stdin"], input=out.stdout, capture_output=True, text=True,
                            timeout=60)
    assert tables.returncode == 0, tables.stderr
    assert "| mlp-init |" in tables.stdout and "base_read" in tables.stdout
