#!/usr/bin/env bash
# Runs the random SIGKILL end-to-end test N times in a row (default 20) and
# stops at the first failure.  A failing run keeps its artifacts (daemon logs,
# config, states, the transport's envelope list) in ./artifacts/<run>/; the
# summary of every run is in ./artifacts/kill_loop.log.
#   bash scripts/kill_loop.sh 20 [pytest -k expression]
set -euo pipefail
cd "$(dirname "$0")/.."
n="${1:-20}"
k="${2:-test_random_workload_with_sigkills_ends_equal}"
mkdir -p artifacts
export CYNOMYS_ARTIFACTS="$PWD/artifacts"
for i in $(seq 1 "$n"); do
  start=$(date +%s)
  if .venv/bin/python -m pytest -q -p no:cacheprovider tests/integration/test_e2e_columnstore.py -k "$k" \
      > "artifacts/run-$i.log" 2>&1; then
    echo "run $i/$n: passed in $(( $(date +%s) - start ))s" | tee -a artifacts/kill_loop.log
    rm -f "artifacts/run-$i.log"
  else
    echo "run $i/$n: FAILED after $(( $(date +%s) - start ))s, see artifacts/run-$i.log" | tee -a artifacts/kill_loop.log
    exit 1
  fi
done
echo "all $n runs passed" | tee -a artifacts/kill_loop.log
