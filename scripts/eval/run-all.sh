#!/bin/bash
# Reproduces every eval result (docs/eval.md): compression over the run and
# restore-and-resume fault tolerance for the digits CNN, the character LM,
# and the two workloads nothing was tuned on (a ResNet with SGD + Nesterov
# momentum, a bf16 fine-tune of the character LM), and transfer learning
# from a checkpoint restored from the mount.
# About 20 minutes on 2 cores with the default backends and one seed, 50
# with SEEDS=0,1,2 (the run in docs/eval.md: 47), depending on the load.
#
#   scripts/eval/run-all.sh [RESULTS_DIR]      (default docs/eval)
#
# Environment: CKPTFS_BIN (default build/mount-tools/ckptfs), BACKENDS
# (comma-separated; default lossless, the default 1e-2, 1e-2 with delta
# chains of up to 20 links instead of 10, that with trellis-coded
# quantization, and the settings that reach 40x on digits (3e-2, chains of
# 20, low-rank first moments, trellis) and on the character LM (3e-2,
# chains of 20, dithered first moments at 1.2, weights at 0.7 of their
# update, second moments within 0.6, trellis); docs/eval.md),
# SEEDS (the seeds each backend's restore-and-resume runs take, default 0;
# SEEDS=0,1,2 triples their time), SIZE (full|smoke),
# WORKDIR (scratch space, default a new temporary directory, removed at the
# end), DAMAGE=1 (also each restore's damage, exp_restore_damage.py, with
# white-noise controls: about 5 minutes per workload and backend). Needs root (FUSE), Debian's python3-torch, python3-sklearn,
# python3-matplotlib, zstd and the `fortunes` package (text corpus).
# A backend the mount does not accept yet is reported as "not run".
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
RESULTS="${1:-$REPO/docs/eval}"
export CKPTFS_BIN="${CKPTFS_BIN:-$REPO/build/mount-tools/ckptfs}"
DEFAULT_BACKENDS="ckptfs-lossless,ckptfs-lossy:1e-2,ckptfs-lossy:1e-2+keyframe=20,ckptfs-lossy:1e-2+keyframe=20+trellis=on"
DEFAULT_BACKENDS+=",ckptfs-lossy:3e-2+keyframe=20+low_rank=on+trellis=on"
DEFAULT_BACKENDS+=",ckptfs-lossy:3e-2+keyframe=20+momentum_dither=1.2+update_fraction=0.7+denominator_budget=0.6+trellis=on"
BACKENDS="${BACKENDS:-$DEFAULT_BACKENDS}"
SIZE="${SIZE:-full}"
PY=/usr/bin/python3
KEEP_WORKDIR=${WORKDIR:+1}
WORKDIR="${WORKDIR:-$(mktemp -d /tmp/ckptfs-eval.XXXXXX)}"
[ -n "$KEEP_WORKDIR" ] || trap 'rm -rf "$WORKDIR"' EXIT
mkdir -p "$RESULTS"
common=(--size "$SIZE" --backends "$BACKENDS" --workdir "$WORKDIR" --results "$RESULTS")
status=0
start=$(date +%s)
for w in digits charlm transfer resnet finetune-bf16; do
  "$PY" "$HERE/exp_compression.py" --workload "$w" "${common[@]}" || status=1
done
for w in digits charlm resnet finetune-bf16; do
  "$PY" "$HERE/exp_fault_tolerance.py" --workload "$w" --seeds "${SEEDS:-0}" "${common[@]}" || status=1
done
"$PY" "$HERE/exp_transfer.py" --seeds "${SEEDS:-0}" "${common[@]}" || status=1
if [ -n "${DAMAGE:-}" ]; then
  for w in digits charlm transfer resnet finetune-bf16; do
    "$PY" "$HERE/exp_restore_damage.py" --workload "$w" --noise 1e-6,1e-2 "${common[@]}" || status=1
  done
fi
"$PY" "$HERE/summary.py" --results "$RESULTS" > "$RESULTS/summary.md"
cat "$RESULTS/summary.md"
echo "run-all: $(( ($(date +%s) - start) / 60 )) min, results in $RESULTS (status $status)" >&2
exit $status
