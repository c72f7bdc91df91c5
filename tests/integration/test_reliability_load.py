"""A small run of scripts/reliability/load_test.py: concurrent checkpoint
writers, small files, reads of files whose encode is pending, with and
without the mem= bound; every byte read back must match."""
import json
import os
import subprocess
import sys

import pytest

from conftest import CKPTFS, REPO, _fuse_usable

pytest.importorskip("torch")


def test_load_with_and_without_memory_bound(tmp_path):
    why = _fuse_usable()
    if why:
        pytest.skip(f"FUSE unavailable: {why}")
    r = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "reliability", "load_test.py"),
                        "--ckptfs", CKPTFS, "--work", str(tmp_path), "--writers", "4", "--mb", "20",
                        "--small", "200", "--variant", "default=", "--variant", "mem48=mem=48"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(r.stdout)
    for name, v in report["variants"].items():
        assert v["mismatches"] == 0, name
        assert v["files"] == 204, name
        assert v["reads_while_pending"] > 0, f"{name}: no read hit a pending encode"
    # mem=48 runs one encode worker and drops the encoders' file mappings:
    # its peak must be below the unbounded run's (same load, same run).
    default, bounded = report["variants"]["default"], report["variants"]["mem48"]
    assert bounded["vm_hwm_mib"] < default["vm_hwm_mib"], report
