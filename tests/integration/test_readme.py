"""README's commands work: every shell block marked `<!-- runnable -->` runs,
as written, in a scratch directory with the built ckptfs first on PATH; and
the README stays a page for users (about 200 lines, every link resolves)."""
import os
import re
import subprocess

import pytest

from conftest import CKPTFS, REPO, _fuse_usable, force_unmount

README = os.path.join(REPO, "README.md")


def runnable_blocks():
    text = open(README).read()
    return re.findall(r"<!-- runnable -->\s*```sh\n(.*?)```", text, re.S)


def test_readme_has_runnable_blocks():
    assert runnable_blocks(), "README lost its runnable example"


@pytest.mark.parametrize("index", range(len(runnable_blocks())))
def test_readme_block_runs(index, tmp_path):
    why = _fuse_usable()
    if why:
        pytest.skip(f"FUSE unavailable: {why}")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    os.symlink(CKPTFS, bin_dir / "ckptfs")
    os.symlink("/usr/bin/python3", bin_dir / "python3")  # the interpreter with torch
    work = tmp_path / "work"
    work.mkdir()
    env = dict(os.environ, PATH=f"{bin_dir}:/usr/sbin:/usr/bin:/sbin:/bin")
    script = "set -euxo pipefail\n" + runnable_blocks()[index]
    try:
        r = subprocess.run(["bash", "-c", script], cwd=work, env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
    finally:
        for d in work.iterdir():
            if d.is_dir():
                force_unmount(str(d))


def test_readme_is_short_and_its_links_resolve():
    text = open(README).read()
    assert len(text.splitlines()) <= 200
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
        if target.startswith("http"):
            continue
        assert os.path.exists(os.path.join(REPO, target)), target
