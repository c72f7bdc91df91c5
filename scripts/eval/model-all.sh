#!/bin/bash
# Runs the codec model (error_model.py) over the variants docs/eval.md
# discusses: where the error that moves the final metric comes from, and
# which error measures would buy ratio at the same accuracy. Seed 0, both
# workloads; about 16 minutes on 2 cores (two variants at a time).
#
#   scripts/eval/model-all.sh [RESULTS_DIR]      (default docs/eval)
#
# Writes RESULTS_DIR/error-model.jsonl (one JSON line per run) and
# error-model.md (the table). Needs Debian's python3-torch and python3-sklearn,
# and the `fortunes` package; no mount, no ckptfs build.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
RESULTS="${1:-$REPO/docs/eval}"
PY=/usr/bin/python3
mkdir -p "$RESULTS"
# One variant per line: the workloads it runs on, then error_model.py's options
# (none: the mount's defaults).
variants="digits,charlm --uninterrupted
digits,charlm
digits,charlm --schedule off --momentum-budget 0.1 --second-moment-budget 0.1
charlm --schedule off --momentum-budget 0.1 --second-moment-budget 0.1 --budget 1e-4
charlm --budget 1e-4
charlm --momentum-budget 1e-4
charlm --second-moment-budget 1e-3
digits,charlm --weights fisher
digits --momentum zero
digits,charlm --momentum-budget 0.5
digits,charlm --momentum step --momentum-budget 0.5
digits,charlm --momentum step --momentum-budget 0.3
digits,charlm --momentum step-prune --momentum-budget 0.3
digits,charlm --momentum step-prune --momentum-budget 0.5"
jobs="$(mktemp)"
trap 'rm -f "$jobs"' EXIT
while read -r workloads options; do
  # No trailing blank: xargs -L would join the next line to this one.
  for w in ${workloads//,/ }; do echo "--workload $w${options:+ $options}"; done
done <<< "$variants" > "$jobs"
start=$(date +%s)
# Each line of $jobs is one run's options; its JSON line goes to stdout.
xargs -P 2 -L 1 "$PY" "$HERE/error_model.py" < "$jobs" > "$RESULTS/error-model.jsonl"
"$PY" "$HERE/model_table.py" "$RESULTS/error-model.jsonl" > "$RESULTS/error-model.md"
cat "$RESULTS/error-model.md"
echo "model-all: $(( ($(date +%s) - start) / 60 )) min, results in $RESULTS" >&2
