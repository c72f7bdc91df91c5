#!/usr/bin/env bash
# Runs every test of ckptfs on a fresh Debian 12 machine: installs what is
# missing, builds (release, and one clang build with ASan+UBSan and the
# fuzzers' instrumentation), runs the unit tests, the GPU
# tests (they skip without a device), short fuzz runs of every parser, and the
# integration tests that mount real FUSE filesystems.
#
# Environment: CKPTFS_FUZZ_SECONDS (default 15 per target),
#              CKPTFS_SKIP_SANITIZE=1 / CKPTFS_SKIP_FUZZ=1 to shorten local runs.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
source scripts/lib/deps.sh
ckptfs_install_deps

jobs=$(nproc)
fail=0
passed_suites=0
failed_suites=()

run_suite() {  # name, command...
  local name=$1; shift
  echo "== $name"
  if "$@"; then
    passed_suites=$((passed_suites + 1))
  else
    failed_suites+=("$name")
    fail=1
  fi
}

echo "== build (release)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCKPTFS_BUILD_TESTS=ON >/dev/null
ninja -C build -j "$jobs"

run_suite "unit tests" ctest --test-dir build --output-on-failure -j "$jobs" -L unit
run_suite "gpu tests (skip without a device)" ctest --test-dir build --output-on-failure -L gpu --no-tests=ignore

source scripts/lib/sanitize_build.sh
if [ "${CKPTFS_SKIP_SANITIZE:-0}" != 1 ]; then
  echo "== build (clang, ASan + UBSan)"
  ckptfs_configure_sanitize_build
  ninja -C "$CKPTFS_SANITIZE_BUILD" -j "$jobs" codec_tests \
    $(ninja -C "$CKPTFS_SANITIZE_BUILD" -t targets all | grep -o '^fs_tests:' | tr -d :)
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  run_suite "unit tests under ASan+UBSan" ctest --test-dir "$CKPTFS_SANITIZE_BUILD" --output-on-failure -j "$jobs" -L unit
fi

if [ "${CKPTFS_SKIP_FUZZ:-0}" != 1 ]; then
  # The same build: only the fuzz targets' own sources are left to compile.
  run_suite "fuzz smoke" scripts/fuzz.sh "${CKPTFS_FUZZ_SECONDS:-15}"
fi

if [ -d tests/integration ] && ls tests/integration/test_*.py >/dev/null 2>&1; then
  export CKPTFS_BIN="$root/build/mount-tools/ckptfs"
  run_suite "integration tests" "$CKPTFS_PYTHON" -m pytest -q -p no:cacheprovider tests/integration
fi

echo "== summary"
if [ "$fail" -ne 0 ]; then
  echo "failed suites: ${failed_suites[*]}"
fi
echo "suites: ${passed_suites} passed, ${#failed_suites[@]} failed"
exit "$fail"
