"""A short run of the crash-consistency harness (scripts/reliability/
crash_harness.py): three random kill -9 moments under concurrent
checkpoint, log, small-file and fsync writers; the long runs are in
docs/reliability.md."""
import importlib.util
import os

import pytest

from conftest import CKPTFS, REPO

pytest.importorskip("torch")


def load_harness():
    path = os.path.join(REPO, "scripts", "reliability", "crash_harness.py")
    spec = importlib.util.spec_from_file_location("crash_harness", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_crash_harness_three_iterations(store, tmp_path):
    # `store` only for its FUSE availability check; the harness mounts its own.
    harness = load_harness()
    summary = harness.run(iterations=3, seed=int(os.environ.get("CKPTFS_CRASH_SEED", "7")), ckptfs=CKPTFS,
                          max_kill_s=1.0, workroot=str(tmp_path))
    assert summary["failed"] == 0, summary["failures"]
    assert summary["files_checked"] > 0
    assert summary["acks"]["closed"] > 0


def test_harness_detects_a_lost_acknowledged_version():
    """The checker must be able to fail: a committed version replaced by an
    older one, or by damaged bytes, is reported."""
    harness = load_harness()
    st = {"versions": {}, "started": [0, 1], "closed": [0, 1], "acked": 1, "prefix": None}
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        for v, data in enumerate((b"old" * 2000, b"new" * 2000)):
            p = os.path.join(d, str(v))
            with open(p, "wb") as f:
                f.write(data)
            st["versions"][v] = p
        assert harness.check_file(None, "exact/f", st, b"new" * 2000) is None
        assert harness.check_file(None, "exact/f", st, b"old" * 2000) is not None
        assert harness.check_file(None, "exact/f", st, b"new" * 1999 + b"neX") is not None
        assert harness.check_file(None, "exact/f", st, None) is not None
        st_fsync = dict(st, closed=[0], acked=1, prefix=(1, 3000))
        assert harness.check_file(None, "exact/f", st_fsync, (b"new" * 2000)[:3500]) is None
        assert harness.check_file(None, "exact/f", st_fsync, (b"new" * 2000)[:2000]) is not None
