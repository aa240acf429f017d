#!/usr/bin/env bash
# Instructions per call that FuseTransport adds, counted by callgrind: repeatable even on a
# loaded machine, where times are not. Each case runs twice (FEW and MANY calls, after the same
# warm-up); the difference divided by MANY - FEW is one call's instructions, start-up excluded.
#
#     bash benchmarks/instructions.sh            # JSON calls: 10 vs 510; streams: 2 vs 22
#
# Needs valgrind. MemoryStore, over httpx.MockTransport (bench_transport.py --just-calls);
# the guard as it comes (the failure-loop breaker on) and with failure_loops=None.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

total() { # case body calls -> instructions of the whole run
  valgrind --tool=callgrind --callgrind-out-file="$work/out" \
    "$python" benchmarks/bench_transport.py --just-calls "$1" "$2" "$3" >/dev/null 2>"$work/err"
  awk '/^(summary|totals):/ {print $2; exit}' "$work/out"
}

per_call() { # case body few many
  local few many
  few=$(total "$1" "$2" "$3")
  many=$(total "$1" "$2" "$4")
  echo $(((many - few) / ($4 - $3)))
}

echo "| body | unguarded | guarded (MemoryStore) | added | failure_loops=None | added |"
echo "|---|---:|---:|---:|---:|---:|"
for spec in "json 10 510" "stream 2 22"; do
  read -r body few many <<<"$spec"
  plain=$(per_call unguarded "$body" "$few" "$many")
  guarded=$(per_call guarded "$body" "$few" "$many")
  bare=$(per_call guarded-no-loops "$body" "$few" "$many")
  echo "| $body | $plain | $guarded | $((guarded - plain)) | $bare | $((bare - plain)) |"
done
