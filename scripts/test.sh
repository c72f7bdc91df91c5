#!/usr/bin/env bash
# Runs every test of ckptfs on a fresh Debian 12 machine: installs what is
# missing, builds (release, and one clang build with ASan+UBSan and the
# fuzzers' instrumentation), runs the unit tests, the GPU
# tests (they skip without a device), short fuzz runs of every parser, and the
# integration tests that mount real FUSE filesystems.
#
# Environment: CKPTFS_FUZZ_SECONDS (default 10 per target),
#              CKPTFS_SKIP_SANITIZE=1 / CKPTFS_SKIP_FUZZ=1 to shorten local runs,
#              CKPTFS_SANITIZED_DAEMON=all to run every integration test (not
#              only the core ones) against the daemon built with ASan+UBSan
#              (about 9 minutes more).
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
  ninja -C "$CKPTFS_SANITIZE_BUILD" -j "$jobs" codec_tests ckptfs \
    $(ninja -C "$CKPTFS_SANITIZE_BUILD" -t targets all | grep -o '^fs_tests:' | tr -d :)
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  run_suite "unit tests under ASan+UBSan" ctest --test-dir "$CKPTFS_SANITIZE_BUILD" --output-on-failure -j "$jobs" -L unit
fi

if [ "${CKPTFS_SKIP_FUZZ:-0}" != 1 ]; then
  # The same build: only the fuzz targets' own sources are left to compile.
  run_suite "fuzz smoke" scripts/fuzz.sh "${CKPTFS_FUZZ_SECONDS:-10}"
fi

if [ -d tests/integration ] && ls tests/integration/test_*.py >/dev/null 2>&1; then
  export CKPTFS_BIN="$root/build/mount-tools/ckptfs"
  run_suite "integration tests" "$CKPTFS_PYTHON" -m pytest -q -p no:cacheprovider tests/integration
fi

# The daemon and the commands themselves under ASan+UBSan (the unit tests
# above cover the libraries, not the FUSE operations, the commit pipeline
# or recovery): the core integration tests against the sanitizer build's
# binary. A daemon's reports go to files (it has no terminal once
# daemonized); any report fails the suite, as does a daemon that an error
# stopped (halt_on_error), which its test sees.
run_sanitized_daemon_tests() {
  local reports status=0
  reports=$(mktemp -d)
  local tests=(tests/integration/test_fs_posix.py tests/integration/test_reliability_posix.py
               tests/integration/test_posix_modes.py tests/integration/test_fs_random.py
               tests/integration/test_fs_crash.py tests/integration/test_fs_torch.py
               tests/integration/test_reliability_hostile.py)
  [ "${CKPTFS_SANITIZED_DAEMON:-core}" = all ] && tests=(tests/integration)
  CKPTFS_BIN="$root/$CKPTFS_SANITIZE_BUILD/mount-tools/ckptfs" \
    ASAN_OPTIONS="detect_leaks=1:log_path=$reports/asan" \
    UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:log_path=$reports/ubsan" \
    "$CKPTFS_PYTHON" -m pytest -q -p no:cacheprovider "${tests[@]}" || status=1
  if compgen -G "$reports/*" >/dev/null; then
    echo "sanitizer reports:"
    cat "$reports"/*
    status=1
  fi
  rm -rf "$reports"
  return "$status"
}
if [ "${CKPTFS_SKIP_SANITIZE:-0}" != 1 ] && [ -d tests/integration ]; then
  run_suite "integration tests, daemon under ASan+UBSan" run_sanitized_daemon_tests
fi

echo "== summary"
if [ "$fail" -ne 0 ]; then
  echo "failed suites: ${failed_suites[*]}"
fi
echo "suites: ${passed_suites} passed, ${#failed_suites[@]} failed"
exit "$fail"
