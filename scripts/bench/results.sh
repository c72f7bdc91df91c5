#!/usr/bin/env bash
# Regenerates README's results table on this machine with this build: the
# codec suite (medians of 3 runs, 2 threads: one run of a small file's
# encode can take ten times its median on a shared machine), the mount
# benchmark (3 rounds), a training run's versions in one mount (4) and the
# shared-store benchmark (3 rounds). Prints the markdown; the JSON of each
# part is kept in $CKPTFS_RESULTS_DIR (default build/results). About 25
# minutes on 2 cores (longer the first time: the suite is made once).
#   scripts/bench/results.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${CKPTFS_RESULTS_DIR:-build/results}
mkdir -p "$out"
source scripts/lib/deps.sh
scripts/bench/codec.sh --runs 3 --threads 2 >"$out/codec.json"
scripts/bench/fs.sh --runs 3 >"$out/fs.json"
scripts/bench/sequence.sh --versions 4 >"$out/sequence.json"
scripts/bench/cluster.sh --runs 3 >"$out/cluster.json" 2>"$out/cluster.log"
"$CKPTFS_PYTHON" scripts/bench/results_table.py --codec "$out/codec.json" --fs "$out/fs.json" \
  --cluster "$out/cluster.json" --sequence "$out/sequence.json" --version "$(build/mount-tools/ckptfs --version | head -1)" \
  --command "scripts/bench/results.sh"
