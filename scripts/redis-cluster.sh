#!/usr/bin/env bash
# A throwaway 3-node Redis Cluster on loopback for the cluster tests.
#
#   scripts/redis-cluster.sh start DIR   # nodes on 127.0.0.1:7301-7303, files under DIR
#                                        # (TOKENFUSE_CLUSTER_PORT=N: nodes on N..N+2)
#   scripts/redis-cluster.sh stop DIR    # stops only the nodes whose pidfiles are in DIR
#
# Then: TOKENFUSE_CLUSTER_URL=redis://127.0.0.1:7301/0 pytest -m cluster
# No persistence; each node has its own directory (config, pidfile, log) under DIR.
# cluster-require-full-coverage no: a dead primary without a replica takes only its own
# slots down, instead of the whole cluster refusing every key (docs/operations.md).
set -euo pipefail

first=${TOKENFUSE_CLUSTER_PORT:-7301}
PORTS=("$first" "$((first + 1))" "$((first + 2))")
HOST=127.0.0.1

usage() {
    echo "usage: $0 start|stop DIR" >&2
    exit 2
}

[ $# -eq 2 ] || usage
action=$1
mkdir -p "$2"
dir=$(cd "$2" && pwd)

node_ok() { # port: the node answers and sees a healthy cluster
    redis-cli -h "$HOST" -p "$1" cluster info 2>/dev/null | grep -q '^cluster_state:ok'
}

start() {
    for port in "${PORTS[@]}"; do
        if redis-cli -h "$HOST" -p "$port" ping >/dev/null 2>&1; then
            echo "something already answers on $HOST:$port; not starting a cluster over it" >&2
            exit 1
        fi
    done
    for port in "${PORTS[@]}"; do
        mkdir -p "$dir/$port"
        rm -f "$dir/$port/nodes.conf" # a fresh cluster each time
        redis-server --bind "$HOST" --port "$port" --dir "$dir/$port" \
            --cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 2000 \
            --cluster-require-full-coverage no \
            --save "" --appendonly no \
            --daemonize yes --pidfile "$dir/$port/redis.pid" --logfile "$dir/$port/redis.log"
    done
    for port in "${PORTS[@]}"; do
        for _ in $(seq 100); do
            redis-cli -h "$HOST" -p "$port" ping >/dev/null 2>&1 && break
            sleep 0.1
        done
    done
    nodes=()
    for port in "${PORTS[@]}"; do nodes+=("$HOST:$port"); done
    redis-cli --cluster create "${nodes[@]}" --cluster-replicas 0 --cluster-yes >"$dir/create.log"
    for _ in $(seq 200); do
        ready=yes
        for port in "${PORTS[@]}"; do node_ok "$port" || ready=no; done
        if [ $ready = yes ]; then
            echo "redis cluster ok on ${nodes[*]}"
            return 0
        fi
        sleep 0.1
    done
    echo "redis cluster did not reach cluster_state:ok (logs in $dir)" >&2
    exit 1
}

stop() {
    # Every node started in DIR, whatever TOKENFUSE_CLUSTER_PORT says now: a stop run without
    # the variable that started the cluster must not leave its nodes holding their ports.
    stopping=()
    for pidfile in "$dir"/*/redis.pid; do
        [ -f "$pidfile" ] || continue
        port=$(basename "$(dirname "$pidfile")")
        pid=$(cat "$pidfile")
        # Only that node: a stale pidfile must not kill whatever reused the PID.
        if tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" | grep -q "redis-server.*:$port" &&
            kill "$pid" 2>/dev/null; then
            stopping+=("$pid")
        fi
        rm -f "$pidfile"
    done
    # Signalled all at once, then waited for: each node takes a moment to shut down.
    for pid in ${stopping[@]+"${stopping[@]}"}; do
        for _ in $(seq 100); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
    done
}

case "$action" in
start) start ;;
stop) stop ;;
*) usage ;;
esac
