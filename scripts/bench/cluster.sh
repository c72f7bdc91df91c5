#!/usr/bin/env bash
# Shared-store benchmark (docs/cluster.md): torch.save of a ~1 GB model +
# Adam checkpoint on "node A" until committed and torch.load on "node B",
# straight into a loopback GlusterFS volume and through ckptfs on it, in
# one run; prints JSON (medians, paired speedups, ratios).
#   scripts/bench/cluster.sh [--model-mb N] [--runs N]
# Needs root and /dev/fuse. Brings the volume up (scripts/cluster/gluster.sh)
# and takes it down again unless it was up before.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/lib/deps.sh
ckptfs_build ckptfs
was_up=0
if scripts/cluster/gluster.sh status | grep -q "node-a: mounted"; then was_up=1; fi
eval "$(scripts/cluster/gluster.sh up)"
work=$(mktemp -d -p "${TMPDIR:-/tmp}" ckptfs-clusterbench.XXXXXX)
cleanup() {
  for m in "$work"/*/mnt-*; do mountpoint -q "$m" && fusermount3 -uz "$m"; done
  rm -rf "$work"
  [ "$was_up" = 1 ] || scripts/cluster/gluster.sh down
}
trap cleanup EXIT
"$CKPTFS_PYTHON" scripts/bench/cluster_bench.py --ckptfs "$(pwd)/build/mount-tools/ckptfs" \
  --node-a "$node_a" --node-b "$node_b" --work "$work" "$@"
