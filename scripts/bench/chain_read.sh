#!/usr/bin/env bash
# Delta-chain read benchmark: copies a run's checkpoints (the *.pt files of
# DIR, in name order) into a fresh mount, waiting for each encode as a
# trainer with a long save interval would, then times a cold read (after a
# remount) of the newest one, for each mount option set. Prints JSON:
# per option set the read times (s), their median and the store's bytes.
#   scripts/bench/chain_read.sh DIR [RUNS] [OPTIONS...]
# Default options: "predict=on" and "predict=off" (step prediction makes a
# read decode the optimizer state of every version below it too).
# Needs root and /dev/fuse; CKPTFS_BIN (default build/mount-tools/ckptfs).
set -euo pipefail
dir=$1
runs=${2:-3}
shift $(( $# >= 2 ? 2 : 1 ))
sets=("$@")
[ ${#sets[@]} -gt 0 ] || sets=(predict=on predict=off)
bin=${CKPTFS_BIN:-$(cd "$(dirname "$0")/../.." && pwd)/build/mount-tools/ckptfs}
files=$(cd "$dir" && ls -1 *.pt | sort)
last=$(echo "$files" | tail -1)
work=$(mktemp -d -p "${TMPDIR:-/tmp}" ckptfs-chainread.XXXXXX)
trap 'mountpoint -q "$work/mnt" && fusermount3 -uz "$work/mnt"; rm -rf "$work"' EXIT
echo "{\"file\": \"$last\", \"versions\": $(echo "$files" | wc -l), \"results\": {"
first=1
for opts in "${sets[@]}"; do
  rm -rf "$work/back" "$work/mnt"; mkdir -p "$work/back" "$work/mnt"
  "$bin" mount "$work/back" "$work/mnt" -o "$opts" >/dev/null
  for f in $files; do
    cp "$dir/$f" "$work/mnt/$f"
    sleep 0.1  # the release reaches the daemon after close() returns
    until [ "$(getfattr --only-values -n user.ckptfs.pending "$work/mnt" 2>/dev/null)" = 0 ]; do sleep 0.05; done
  done
  "$bin" umount "$work/mnt" >/dev/null
  times=()
  for _ in $(seq "$runs"); do
    "$bin" mount "$work/back" "$work/mnt" -o "$opts" >/dev/null
    start=$(date +%s.%N); cat "$work/mnt/$last" > /dev/null; end=$(date +%s.%N)
    times+=("$(printf "%.4f" "$(echo "$end - $start" | bc)")")
    "$bin" umount "$work/mnt" >/dev/null
  done
  median=$(printf '%s\n' "${times[@]}" | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}')
  stored=$(du -sb "$work/back" | cut -f1)
  [ $first = 1 ] || echo ","
  first=0
  echo "\"$opts\": {\"read_s\": [$(IFS=,; echo "${times[*]}")], \"median_s\": $median, \"store_bytes\": $stored}"
done
echo "}}"
