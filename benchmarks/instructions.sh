#!/usr/bin/env bash
# Instructions per call that FuseTransport (or the TokenFuse middleware) adds, counted by
# callgrind: repeatable even on a loaded machine, where times are not. Each case runs twice (FEW
# and MANY calls, after the same warm-up); the difference divided by MANY - FEW is one call's
# instructions, start-up excluded.
#
#     bash benchmarks/instructions.sh                  # JSON calls: 10 vs 510; streams: 2 vs 22
#     bash benchmarks/instructions.sh middleware [url] # requests: 20 vs 220
#     bash benchmarks/instructions.sh sync [url]       # sync PING, run(Record), Fuse.record:
#                                                      # 100 vs 1100 (from_url's client;
#                                                      # plain-: a plain redis.Redis)
#
# Needs valgrind. The transport: MemoryStore, over httpx.MockTransport (bench_transport.py
# --just-calls); the guard as it comes (the failure-loop breaker on) and with
# failure_loops=None. The middleware: a bare Starlette endpoint and TokenFuse in front of it on
# MemoryStore and on RedisStore (bench_middleware.py --just-requests; Redis at [url], database
# 15 of the local server by default), the breaker on and off; on Redis the count includes
# redis-py's and the event loop's work for the round trip. Then the floor, calls alone: an
# async PING, and the Admit script's EVALSHA (with CheckLoops in one round trip) sent bare by
# redis-py.
#
# Instructions are not time: a tight loop (httpx handing on an in-memory stream's chunks) runs
# two to three times as many a nanosecond as the guard's code and its byte searches do, so a
# stream's added instructions understate its added time (see bench_transport.py's docstring).
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

if [[ ${1:-} == sync ]]; then # bash benchmarks/instructions.sh sync [redis-url]: 100 vs 1100
  calls() { # case calls -> instructions of the whole run
    valgrind --tool=callgrind --callgrind-out-file="$work/out" "$python" benchmarks/bench_store.py \
      --redis "${2:-redis://127.0.0.1:6379/15}" --just-calls "$1" "$3" >/dev/null 2>"$work/err"
    awk '/^(summary|totals):/ {print $2; exit}' "$work/out"
  }
  echo "| sync call (on RedisStore.from_url's client; plain-: on a plain redis.Redis) | instructions per call |"
  echo "|---|---:|"
  for case in ping run record plain-ping plain-record; do
    few=$(calls "$case" "${2:-}" 100)
    many=$(calls "$case" "${2:-}" 1100)
    echo "| $case | $(((many - few) / 1000)) |"
  done
  exit 0
fi

if [[ ${1:-} == middleware ]]; then # bash benchmarks/instructions.sh middleware [redis-url]
  requests() { # case requests -> instructions of the whole run
    valgrind --tool=callgrind --callgrind-out-file="$work/out" "$python" \
      benchmarks/bench_middleware.py --redis "${url:-redis://127.0.0.1:6379/15}" \
      --just-requests "$1" "$2" >/dev/null 2>"$work/err"
    awk '/^(summary|totals):/ {print $2; exit}' "$work/out"
  }
  url=${2:-}
  echo "| case | instructions per request | added to the bare endpoint |"
  echo "|---|---:|---:|"
  bare=0
  for case in bare memory memory-no-loops redis redis-no-loops ping bare-admit bare-admit-check; do
    few=$(requests "$case" 20)
    many=$(requests "$case" 220)
    each=$(((many - few) / 200))
    [[ $case == bare ]] && bare=$each
    if [[ $case == ping || $case == bare-* ]]; then # calls alone, no endpoint to add to
      echo "| $case | $each | |"
    else
      echo "| $case | $each | $((each - bare)) |"
    fi
  done
  exit 0
fi

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
