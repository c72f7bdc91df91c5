#!/usr/bin/env bash
# Filesystem benchmark: dd of 1 GiB and torch.save/torch.load of a ~1 GB
# checkpoint (model + Adam) into the backing disk, into ckptfs and into
# ckptfs with compression off, in one run; prints JSON (medians, ratios).
#   scripts/bench/fs.sh [--dd-mib N] [--model-mb N] [--runs N]
# Needs root and /dev/fuse. Uses a scratch directory under $TMPDIR (or /tmp).
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/lib/deps.sh
ckptfs_build ckptfs
work=$(mktemp -d -p "${TMPDIR:-/tmp}" ckptfs-fsbench.XXXXXX)
trap 'for m in "$work"/*/mnt; do mountpoint -q "$m" && fusermount3 -uz "$m"; done; rm -rf "$work"' EXIT
"$CKPTFS_PYTHON" scripts/bench/fs_bench.py --ckptfs "$(pwd)/build/mount-tools/ckptfs" --work "$work" "$@"
