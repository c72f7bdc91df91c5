"""A loopback GlusterFS volume with two client mounts ("node A", "node B"),
brought up by scripts/cluster/gluster.sh, and ckptfs daemons on them."""
import os
import shutil
import subprocess

import pytest

from conftest import REPO, Mount, _fuse_usable

GLUSTER_SH = os.path.join(REPO, "scripts", "cluster", "gluster.sh")


def gluster_unavailable():
    why = _fuse_usable()
    if why:
        return f"FUSE unavailable: {why}"
    for exe in ("/usr/sbin/glusterd", "/usr/sbin/glusterfs"):
        if not os.path.exists(exe):
            return f"GlusterFS is not installed ({exe} missing: Debian packages glusterfs-server, glusterfs-client)"
    if os.geteuid() != 0:
        return "a GlusterFS volume needs root"
    return None


class Cluster:
    def __init__(self, node_a, node_b):
        self.nodes = [node_a, node_b]


def gluster_cluster():
    """Generator for a module-scoped fixture: the volume's two client mounts."""
    why = gluster_unavailable()
    if why:
        pytest.skip(why)
    r = subprocess.run([GLUSTER_SH, "up"], capture_output=True, text=True)
    if r.returncode != 0:
        # The packages are there but the volume would not start: a real failure.
        raise AssertionError(f"gluster.sh up failed: {r.stderr}")
    nodes = dict(line.split("=", 1) for line in r.stdout.split())
    try:
        yield Cluster(nodes["node_a"], nodes["node_b"])
    finally:
        subprocess.run([GLUSTER_SH, "down"], capture_output=True, text=True)


class NodeDaemon(Mount):
    """A ckptfs daemon on one node's client mount of the shared store."""

    def __init__(self, tmp_path, node_root, name, store="store"):
        super().__init__(tmp_path / name)
        shutil.rmtree(self.backing, ignore_errors=True)
        self.backing = os.path.join(node_root, store)
        os.makedirs(self.backing, exist_ok=True)
        self.local_staging = str(tmp_path / name / "local-staging")

    def mount(self, opts="", check=True):
        # The default policy (lossy on), as users run it.
        return super().mount("lossy=on" + ("," + opts if opts else ""), check=check)
