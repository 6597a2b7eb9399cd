#!/usr/bin/env bash
# proton-C's example broker (examples/c/broker.c of Qpid Proton), the baseline for
# benchmarks/run_perf.py: installs the Debian packages, builds it with gcc, starts/stops it.
#
#   benchmarks/baseline_proton_c_broker.sh build
#   benchmarks/baseline_proton_c_broker.sh start [PORT]   # background; prints the URL
#   benchmarks/baseline_proton_c_broker.sh stop  [PORT]
#   benchmarks/baseline_proton_c_broker.sh run   [PORT]   # foreground
#
# WINDOW=N builds a variant whose incoming credit window is N instead of the example's 5
# (the example grants producers 5 credits at a time "to show flow control in action").
# BUILD_DIR (default /tmp/proton-c-broker) holds the binaries, pid and log files.
#
# What the example does, to read its figures right: 4 proactor threads; one in-memory
# queue per address; every message it sends to a consumer is pre-settled (at-most-once
# towards consumers), every message it receives is accepted once queued (no persistence).
set -euo pipefail

ACTION=${1:-start}
PORT=${2:-5673}
WINDOW=${WINDOW:-}
BUILD_DIR=${BUILD_DIR:-/tmp/proton-c-broker}
EXAMPLES=/usr/share/proton/examples/c
NAME=broker${WINDOW:+-window$WINDOW}
BIN=$BUILD_DIR/$NAME

install() {
    if [[ -f $EXAMPLES/broker.c && -f /usr/include/proton/proactor.h ]] && command -v gcc >/dev/null; then
        return
    fi
    echo "installing libqpid-proton11-dev-examples libqpid-proton11-dev gcc" >&2
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y libqpid-proton11-dev-examples libqpid-proton11-dev gcc >&2; then
        apt-get update >&2
        apt-get install -y libqpid-proton11-dev-examples libqpid-proton11-dev gcc >&2
    fi
}

build() {
    install
    mkdir -p "$BUILD_DIR"
    if [[ -x $BIN && $BIN -nt $EXAMPLES/broker.c ]]; then
        return
    fi
    local src=$EXAMPLES/broker.c
    if [[ -n $WINDOW ]]; then
        src=$BUILD_DIR/$NAME.c
        sed "s/^const int WINDOW=5;/const int WINDOW=$WINDOW;/" "$EXAMPLES/broker.c" >"$src"
        grep -q "^const int WINDOW=$WINDOW;" "$src" || { echo "could not set WINDOW in broker.c" >&2; exit 1; }
    fi
    # thread.h sits beside broker.c; Debian ships one libqpid-proton (core + proactor)
    gcc -O2 -o "$BIN" "$src" -I"$EXAMPLES" -lqpid-proton -lpthread
    echo "built $BIN" >&2
}

listening() {
    (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null
}

start() {
    build
    local pidfile=$BUILD_DIR/$NAME-$PORT.pid log=$BUILD_DIR/$NAME-$PORT.log
    if [[ -f $pidfile ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
        echo "already running (pid $(cat "$pidfile"))" >&2
    else
        # run from the examples dir so it finds its ssl-certs (it serves plain AMQP either way)
        (cd "$EXAMPLES" && exec "$BIN" 127.0.0.1 "$PORT") >"$log" 2>&1 &
        echo $! >"$pidfile"
    fi
    for _ in $(seq 100); do
        if listening; then
            echo "amqp://127.0.0.1:$PORT"
            return
        fi
        sleep 0.1
    done
    echo "proton-C broker not listening on $PORT; log:" >&2
    cat "$log" >&2
    exit 1
}

stop() {
    local pidfile=$BUILD_DIR/$NAME-$PORT.pid
    if [[ -f $pidfile ]]; then
        kill "$(cat "$pidfile")" 2>/dev/null || true
        rm -f "$pidfile"
    fi
}

case $ACTION in
    build) build ;;
    start) start ;;
    stop) stop ;;
    run) build && cd "$EXAMPLES" && exec "$BIN" 127.0.0.1 "$PORT" ;;
    *) echo "usage: $0 build|start|stop|run [PORT]   (env: WINDOW, BUILD_DIR)" >&2; exit 2 ;;
esac
