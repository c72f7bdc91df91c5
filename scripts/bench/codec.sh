#!/usr/bin/env bash
# Codec benchmark of record: makes the suite of checkpoints that look like
# real training (scripts/bench/make_suite.py: an MLP near initialization, a
# transformer LM with versions near and far apart, a conv net, mixed
# precision, a checkpoint over 1 GB; about 4 GB, made once and kept), then
# runs `ckptfs encode` / `ckptfs decode` on every version side by side with
# zstd -1 and -3 on the same files (scripts/bench/codec_suite.py). Prints
# JSON, or a table with --markdown.
#   scripts/bench/codec.sh [--runs N] [--threads 1,2] [--only NAME,...] [--markdown]
# CKPTFS_BENCH_SUITE: where the suite lives (default build/bench-suite).
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/lib/deps.sh
ckptfs_build ckptfs
suite=${CKPTFS_BENCH_SUITE:-build/bench-suite}
"$CKPTFS_PYTHON" scripts/bench/make_suite.py "$suite" >&2
"$CKPTFS_PYTHON" scripts/bench/codec_suite.py --ckptfs "$(pwd)/build/mount-tools/ckptfs" --suite "$suite" --work build "$@"
