#!/usr/bin/env bash
# Builds the libFuzzer targets with clang-14 (in the sanitizer build that
# scripts/test.sh's unit tests under ASan share) and runs each for N seconds
# (default 10) over its committed seed corpus. New inputs go to a scratch
# copy, so the committed corpus only changes on purpose.
#   scripts/fuzz.sh [SECONDS] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-10}
shift || true
source scripts/lib/sanitize_build.sh
ckptfs_configure_sanitize_build
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for src in tests/fuzz/*_fuzz.cc; do
    [ -e "$src" ] || continue
    targets+=("$(basename "$src" .cc)")
  done
fi
if [ ${#targets[@]} -eq 0 ]; then
  echo "no fuzz targets"
  exit 0
fi
ninja -C "$CKPTFS_SANITIZE_BUILD" "${targets[@]}"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
status=0
for t in "${targets[@]}"; do
  corpus_name=${t%_fuzz}
  mkdir -p "$scratch/$corpus_name"
  if [ -d "tests/fuzz/corpus/$corpus_name" ]; then
    cp -r "tests/fuzz/corpus/$corpus_name/." "$scratch/$corpus_name/"
  fi
  echo "-- $t for ${seconds}s"
  if ! "$CKPTFS_SANITIZE_BUILD/tests/$t" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 \
      -artifact_prefix="$scratch/" "$scratch/$corpus_name" 2>"$scratch/$t.log"; then
    echo "FUZZ FAILURE in $t:"
    tail -40 "$scratch/$t.log"
    status=1
  else
    grep -E '^Done|#[0-9]+.*DONE' "$scratch/$t.log" | tail -1 || true
  fi
done
exit $status
