#!/usr/bin/env bash
# The lossy codec's variants side by side (the codec benchmark of record is
# codec.sh, on the suite): makes a trained fp32 checkpoint (model + Adam state), a
# bf16 one and a short sequence of versions, then prints JSON comparing the
# ckptfs codec with zstd -1 and zstd -3 on the same bytes (ratio, encode and
# decode MB/s on one core, medians). A second JSON object follows with the
# lossy codec at per-tensor rel_l2 budgets 1e-2 and 5e-2 (ratio vs budget,
# achieved max rel_l2) on the same files and sequence, at 1e-2 with the
# optimizer state at 1e-2 too (instead of the default 0.2), and at 1e-2 with
# Adam's second moments lossless instead of in log mode. The last object,
# "lossy_rel_l2_1e-2_dsq", encodes a converging sequence (training continued
# with a learning rate halved every version, seq-decay/) at budget 1e-2 with
# the budget schedule off and dsq: per version the ratio, the model's true
# update from the previous version, the error achieved and the budget applied.
#   scripts/bench/lossy_variants.sh [OUT_JSON]
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/lib/deps.sh
ckptfs_build checkpoint_bench
data=${CKPTFS_BENCH_DATA:-build/bench-data}
if [ ! -f "$data/bf16-model.pt" ] || [ ! -d "$data/seq-decay" ]; then
  "$CKPTFS_PYTHON" scripts/bench/make_checkpoints.py "$data"
fi
out=${1:-/dev/stdout}
{
  echo '{"lossless":'
  build/tests/bench/checkpoint_bench --runs 5 "$data/fp32.pt" "$data/bf16.pt" "$data/bf16-model.pt" --seq "$data"/seq/v*.pt
  for budget in 1e-2 5e-2; do
    echo ", \"lossy_rel_l2_$budget\":"
    build/tests/bench/checkpoint_bench --runs 3 --budget "$budget" "$data/fp32.pt" "$data/bf16.pt" "$data/bf16-model.pt" --seq "$data"/seq/v*.pt
  done
  # The same at 1e-2 with the optimizer state at 1e-2 too (the default before
  # its optimizer floor), for the side-by-side comparison.
  echo ', "lossy_rel_l2_1e-2_opt_1e-2":'
  build/tests/bench/checkpoint_bench --runs 3 --budget 1e-2 --opt-budget 1e-2 \
    "$data/fp32.pt" "$data/bf16.pt" "$data/bf16-model.pt" --seq "$data"/seq/v*.pt
  # The same at 1e-2 with Adam's second moments lossless (the policy before
  # the log mode), for the side-by-side comparison.
  echo ', "lossy_rel_l2_1e-2_denominators_lossless":'
  build/tests/bench/checkpoint_bench --runs 3 --budget 1e-2 --policy scripts/bench/denominators-lossless.toml \
    "$data/fp32.pt" "$data/bf16.pt" "$data/bf16-model.pt" --seq "$data"/seq/v*.pt
  echo ', "lossy_rel_l2_1e-2_dsq": {"off":'
  build/tests/bench/checkpoint_bench --runs 3 --budget 1e-2 --schedule off --seq "$data"/seq-decay/v*.pt
  echo ', "dsq":'
  build/tests/bench/checkpoint_bench --runs 3 --budget 1e-2 --schedule dsq --seq "$data"/seq-decay/v*.pt
  echo '}}'
} > "$out"
