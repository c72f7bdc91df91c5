#!/usr/bin/env bash
# One command for a machine with an NVIDIA GPU: configures and builds ckptfs,
# runs the GPU tests (CUDA kernels vs the CPU reference, bit for bit, and
# cross-decoding) and the lossy kernel benchmark, and writes JSON and logs to
# $OUT (or ./gpu-results). Meant to finish in well under 5 minutes.
#
# Output files:
#   summary.json       device, pass/fail per step, test counts, seconds
#   gpu_tests.json     GoogleTest report of gpu_tests
#   gpu_bench.json     per-kernel ms and GB/s, end-to-end encode/decode GB/s
#   lossy_bench.json   whole-codec benchmark on the GPU backend (if the target is built)
#   *.log              build and run logs; nvidia-smi.txt
# Exit status: 0 when every step passed and the GPU tests really ran.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-$PWD/gpu-results}
mkdir -p "$out"
build=${CKPTFS_GPU_BUILD_DIR:-build-gpu}
t0=$(date +%s)
status=0
steps=()

step() {  # name, timeout seconds, command...
  local name=$1 limit=$2
  shift 2
  local s0 rc
  s0=$(date +%s)
  echo "== $name"
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  rc=$?
  steps+=("{\"step\": \"$name\", \"rc\": $rc, \"seconds\": $(($(date +%s) - s0))}")
  if [ "$rc" -ne 0 ]; then
    echo "   failed (rc=$rc), last lines of $out/$name.log:"
    tail -20 "$out/$name.log"
    status=1
  fi
  return "$rc"
}

{ nvidia-smi || echo "nvidia-smi not available"; } >"$out/nvidia-smi.txt" 2>&1
device=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)

step configure 120 cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
targets=(gpu_tests)
if ninja -C "$build" -t targets all 2>/dev/null | grep -q '^lossy_bench:'; then targets+=(lossy_bench); fi
step build 240 ninja -C "$build" "${targets[@]}"

step gpu_tests 120 "$build/tests/gpu_tests" --gtest_filter='LossyGpuTest.*' --gtest_output="json:$out/gpu_tests.json"
# A skipped comparison means no device was used: that is a failure here.
if grep -q '\[  SKIPPED \]' "$out/gpu_tests.log"; then
  echo "   gpu tests were skipped: $(grep -m1 -A1 'Skipped' "$out/gpu_tests.log" | tail -1)"
  status=1
fi

step gpu_bench 120 env CKPTFS_GPU_BENCH_JSON="$out/gpu_bench.json" \
  "$build/tests/gpu_tests" --gtest_filter='LossyGpuBenchmark.*'

if [ -x "$build/tests/bench/lossy_bench" ]; then
  step lossy_bench 120 sh -c "'$build/tests/bench/lossy_bench' --gpu on --wall 1 --chunks 16 >'$out/lossy_bench.json'"
fi

passed=$(grep -o '"tests": *[0-9]*' "$out/gpu_tests.json" 2>/dev/null | head -1 | grep -o '[0-9]*$')
failed=$(grep -o '"failures": *[0-9]*' "$out/gpu_tests.json" 2>/dev/null | head -1 | grep -o '[0-9]*$')
bench=$(cat "$out/gpu_bench.json" 2>/dev/null || echo null)
{
  echo "{"
  echo "  \"device\": \"${device:-none}\","
  echo "  \"ok\": $([ "$status" -eq 0 ] && echo true || echo false),"
  echo "  \"seconds\": $(($(date +%s) - t0)),"
  echo "  \"gpu_tests\": {\"tests\": ${passed:-0}, \"failures\": ${failed:-0}},"
  echo "  \"steps\": [$(IFS=,; echo "${steps[*]}")],"
  echo "  \"benchmark\": ${bench:-null}"
  echo "}"
} >"$out/summary.json"
cat "$out/summary.json"
exit "$status"
