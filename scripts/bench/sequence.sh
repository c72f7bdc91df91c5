#!/usr/bin/env bash
# Sequence benchmark (docs/bench.md): the versions of one training run
# saved into one kept mount, then read back on it, against the backing disk
# and passthrough; prints JSON.
#   scripts/bench/sequence.sh [--model-mb N] [--versions N]
# Needs root and /dev/fuse. Uses a scratch directory under $TMPDIR (or /tmp).
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/lib/deps.sh
ckptfs_build ckptfs
work=$(mktemp -d -p "${TMPDIR:-/tmp}" ckptfs-seqbench.XXXXXX)
trap 'for m in "$work"/*/mnt; do mountpoint -q "$m" && fusermount3 -uz "$m"; done; rm -rf "$work"' EXIT
"$CKPTFS_PYTHON" scripts/bench/sequence_bench.py --ckptfs "$(pwd)/build/mount-tools/ckptfs" --work "$work" "$@"
