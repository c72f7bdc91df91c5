"""The Debian package (cpack -G DEB from the build directory): its files,
and, where the machine allows, installing it with dpkg and mounting through
`mount -t fuse.ckptfs`."""
import glob
import os
import shutil
import subprocess

import pytest

from conftest import CKPTFS, _fuse_usable, force_unmount

BUILD = os.path.dirname(os.path.dirname(os.path.realpath(CKPTFS)))


@pytest.fixture(scope="module")
def deb(tmp_path_factory):
    config = os.path.join(BUILD, "CPackConfig.cmake")
    if not os.path.exists(config) or not shutil.which("cpack") or not shutil.which("dpkg-deb"):
        pytest.skip(f"no CPack configuration in {BUILD} or no cpack/dpkg-deb")
    out = tmp_path_factory.mktemp("deb")
    r = subprocess.run(["cpack", "-G", "DEB", "--config", config, "-B", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    debs = glob.glob(str(out / "ckptfs_*.deb"))
    assert len(debs) == 1, os.listdir(out)
    return debs[0]


def test_package_holds_the_tool_its_mount_helpers_and_the_man_page(deb, tmp_path):
    info = subprocess.run(["dpkg-deb", "-f", deb, "Package", "Version", "Depends"], capture_output=True,
                          text=True, check=True).stdout
    assert "Package: ckptfs" in info
    assert "fuse3" in info and "libfuse3" in info and "libzstd" in info  # what the binary links
    root = tmp_path / "root"
    subprocess.run(["dpkg-deb", "-x", deb, str(root)], check=True)
    for link in ("usr/sbin/mount.fuse.ckptfs", "usr/sbin/mount.ckptfs"):
        assert os.readlink(root / link) == "../bin/ckptfs"
    assert (root / "usr/share/man/man1/ckptfs.1").exists()
    assert (root / "usr/share/doc/ckptfs/examples/mnt-ckpt.mount").exists()
    r = subprocess.run([str(root / "usr/bin/ckptfs"), "--version"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith("ckptfs ") and "store format 1" in r.stdout


def test_dpkg_installs_it_and_mount_t_fuse_ckptfs_mounts(deb, tmp_path):
    why = _fuse_usable()
    if why:
        pytest.skip(f"FUSE unavailable: {why}")
    if os.geteuid() != 0 or not shutil.which("dpkg"):
        pytest.skip("installing a package needs root and dpkg")
    installed = subprocess.run(["dpkg-query", "-W", "-f=${Status}", "ckptfs"], capture_output=True, text=True)
    if "installed" in installed.stdout or os.path.exists("/usr/bin/ckptfs"):
        pytest.skip("a ckptfs is installed on this machine already; not replacing it")
    backing, mnt = tmp_path / "store", tmp_path / "mnt"
    backing.mkdir()
    mnt.mkdir()
    r = subprocess.run(["dpkg", "-i", deb], capture_output=True, text=True)
    try:
        assert r.returncode == 0, r.stdout + r.stderr
        r = subprocess.run(["mount", "-t", "fuse.ckptfs", str(backing), str(mnt), "-o",
                            f"level=lossless,log={tmp_path}/log"], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        try:
            with open(mnt / "hello.bin", "wb") as f:
                f.write(b"checkpoint" * 1000)
            subprocess.run(["/usr/bin/ckptfs", "umount", str(mnt)], check=True)
            r = subprocess.run(["/usr/bin/ckptfs", "restore", str(backing / "hello.bin"), str(tmp_path / "out")],
                               capture_output=True, text=True)
            assert r.returncode == 0, r.stderr
            assert (tmp_path / "out").read_bytes() == b"checkpoint" * 1000
        finally:
            force_unmount(str(mnt))
    finally:
        subprocess.run(["dpkg", "-r", "ckptfs"], capture_output=True)
    assert not os.path.exists("/usr/sbin/mount.fuse.ckptfs")
