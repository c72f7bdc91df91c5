"""Long commands draw a progress line on a terminal only: with stderr a
pseudo-terminal `ckptfs encode` of a 128 MB float array shows one and
erases it; piped or with --quiet it prints nothing extra. The first line
is drawn after CKPTFS_PROGRESS_MS (here 10 ms; 250 by default): the encode
takes a few tenths of a second on one thread, too close to the default."""
import os
import pty
import subprocess

import pytest

from conftest import CKPTFS

np = pytest.importorskip("numpy")


def run_with_tty_stderr(args):
    master, slave = pty.openpty()
    try:
        p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=slave,
                             env=dict(os.environ, CKPTFS_PROGRESS_MS="10"))
        os.close(slave)
        err = b""
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:
                break
            if not chunk:
                break
            err += chunk
        p.stdout.read()
        p.wait()
        return p.returncode, err
    finally:
        os.close(master)


def test_encode_shows_progress_on_a_terminal_only(tmp_path):
    src = tmp_path / "weights.npy"
    np.save(src, np.random.default_rng(0).standard_normal(32 << 20, dtype=np.float32))
    encode = [CKPTFS, "encode", str(src), "--budget", "0.01", "--threads", "1"]
    rc, err = run_with_tty_stderr(encode + [str(tmp_path / "b1")])
    assert rc == 0
    assert b"encode " in err and b"MB" in err and b" s" in err, err[:200]
    assert err.endswith(b"\r\x1b[K")  # erased before the command's own output... which goes to stdout
    r = subprocess.run(encode + [str(tmp_path / "b2")], capture_output=True)
    assert r.returncode == 0 and r.stderr == b""  # piped: nothing
    rc, err = run_with_tty_stderr(encode + [str(tmp_path / "b3"), "--quiet"])
    assert rc == 0 and err == b""
