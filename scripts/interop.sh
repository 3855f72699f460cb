#!/usr/bin/env bash
# Manual compatibility check against upstream OpenEnv 0.10.0 (`make interop`). Not a CI test.
#
# Upstream is installed from PyPI into its own venv (.interop-venv) and used only as a black box.
# Environments are served on 127.0.0.1 under both cores, and scripts/interop/drive.py drives each
# server with both cores' clients (ours->upstream, upstream->ours, and both controls):
#   typed     scripts/interop/counter_app.py          a typed (non-MCP) environment
#   mcp       scripts/interop/mcp_app.py              an MCPEnvironment with tools add and shout
#   template  `openenv init interop_tmpl` (upstream's CLI), served unchanged
#   echo      $UPSTREAM_ECHO_ENV_DIR (upstream's envs/echo_env source), served unchanged; optional
# Prints a matrix (rows: server core x env kind, columns: client core, cells: passed/total) and
# exits non-zero if any check failed. Servers are killed by PID on exit, also on failure.
#
# Environment: PYTHON (interpreter for the upstream venv, default python3), VERBOSE=1 (print every
# check, not only FAIL/NOTE lines), KEEP_TMP=1 (keep the temp dir with logs and the template).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
UPSTREAM_VERSION=0.10.0
OURS_VENV="$ROOT/.venv"
UPSTREAM_VENV="$ROOT/.interop-venv"
HERE="$ROOT/scripts/interop"
START_TIMEOUT_S=60   # per server, until /health answers
DRIVE_TIMEOUT_S=120  # per driver run

# Nothing from the caller's shell may change which core a process imports or how it serves.
unset PYTHONPATH ENABLE_WEB_INTERFACE OPENENV_MODE OPENENV_CLIENT_MODE OPENENV_STEP_TIMEOUT_S MAX_CONCURRENT_ENVS
export PYTHONDONTWRITEBYTECODE=1 NO_PROXY="127.0.0.1,localhost" no_proxy="127.0.0.1,localhost"

log() { printf '[interop] %s\n' "$*"; }

TMP="$(mktemp -d -t openenv-interop.XXXXXX)"
mkdir -p "$TMP/logs" "$TMP/results"
SERVER_PIDS=()
DRIVER_PIDS=()
FINAL_RC=1

cleanup() {
    local pid
    for pid in "${DRIVER_PIDS[@]}" "${SERVER_PIDS[@]}"; do
        kill "$pid" 2>/dev/null
    done
    for _ in $(seq 50); do  # up to 5 s for a clean shutdown
        local alive=0
        for pid in "${DRIVER_PIDS[@]}" "${SERVER_PIDS[@]}"; do
            kill -0 "$pid" 2>/dev/null && alive=1
        done
        [ "$alive" = 0 ] && break
        sleep 0.1
    done
    for pid in "${DRIVER_PIDS[@]}" "${SERVER_PIDS[@]}"; do
        kill -9 "$pid" 2>/dev/null
    done
    if [ "${KEEP_TMP:-0}" = 1 ] || [ "$FINAL_RC" != 0 ]; then
        log "logs kept in $TMP"
    else
        rm -rf "$TMP"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- 1. the two venvs ---------------------------------------------------------------------------
if [ ! -x "$OURS_VENV/bin/python" ]; then
    log "creating .venv (make setup)"
    make setup || exit 1
fi
if ! "$UPSTREAM_VENV/bin/python" - "$UPSTREAM_VERSION" 2>/dev/null <<'EOF'
import sys
from importlib.metadata import version
sys.exit(version("openenv") != sys.argv[1])
EOF
then
    log "creating .interop-venv with openenv==$UPSTREAM_VERSION from PyPI (once; pulls gradio & co.)"
    rm -rf "$UPSTREAM_VENV"
    "${PYTHON:-python3}" -m venv "$UPSTREAM_VENV" || exit 1
    "$UPSTREAM_VENV/bin/python" -m pip install --quiet --upgrade pip || exit 1
    "$UPSTREAM_VENV/bin/python" -m pip install --quiet "openenv==$UPSTREAM_VERSION" || exit 1
fi
OURS_VERSION="$("$OURS_VENV/bin/python" -c 'from importlib.metadata import version; print(version("openenv"))')"
log "ours: openenv $OURS_VERSION (.venv)   upstream: openenv $UPSTREAM_VERSION (.interop-venv)"
STARTED_AT=$SECONDS

# --- 2. the environments ----------------------------------------------------------------------------
log "generating upstream's template: openenv init interop_tmpl --output-dir $TMP/tmpl"
mkdir -p "$TMP/tmpl"
TEMPLATE_DIR="$TMP/tmpl/interop_tmpl"
if ! (cd "$TMP/tmpl" && timeout 120 "$UPSTREAM_VENV/bin/openenv" init interop_tmpl --output-dir "$TMP/tmpl") \
        >"$TMP/logs/openenv-init.log" 2>&1 || [ ! -f "$TEMPLATE_DIR/server/app.py" ]; then
    log "openenv init failed:"; tail -20 "$TMP/logs/openenv-init.log"
    TEMPLATE_DIR=""
fi

ECHO_DIR=""
if [ -n "${UPSTREAM_ECHO_ENV_DIR:-}" ]; then
    if [ -f "$UPSTREAM_ECHO_ENV_DIR/server/app.py" ]; then
        ECHO_DIR="$(cd "$UPSTREAM_ECHO_ENV_DIR" && pwd)"
        log "echo: serving $ECHO_DIR unchanged under both cores"
    else
        log "UPSTREAM_ECHO_ENV_DIR=$UPSTREAM_ECHO_ENV_DIR has no server/app.py: echo skipped"
    fi
else
    log "UPSTREAM_ECHO_ENV_DIR not set: upstream's echo_env is skipped"
fi

# Free ports, all at once so they are distinct.
read -r -a PORTS <<<"$("$OURS_VENV/bin/python" - <<'EOF'
import socket
socks = [socket.socket() for _ in range(8)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))
for s in socks:
    s.close()
EOF
)"

: >"$TMP/results/servers.tsv"
declare -A URL PID CWD
SERVERS=()

# start_server CORE KIND CWD APP [PYTHONPATH]
start_server() {
    local core="$1" kind="$2" cwd="$3" app="$4" extra_path="${5:-}" venv port
    venv="$OURS_VENV"; [ "$core" = upstream ] && venv="$UPSTREAM_VENV"
    port="${PORTS[${#SERVERS[@]}]}"
    (
        cd "$cwd" || exit 1
        [ -n "$extra_path" ] && export PYTHONPATH="$extra_path"
        exec "$venv/bin/python" -m uvicorn "$app" --host 127.0.0.1 --port "$port" --log-level warning
    ) >"$TMP/logs/server-$core-$kind.log" 2>&1 &
    local pid=$!
    SERVER_PIDS+=("$pid")
    SERVERS+=("$core/$kind")
    URL[$core/$kind]="http://127.0.0.1:$port"
    PID[$core/$kind]="$pid"
    CWD[$core/$kind]="$cwd"
}

for core in ours upstream; do
    start_server "$core" typed "$HERE" counter_app:app
    start_server "$core" mcp "$HERE" mcp_app:app
    if [ -n "$TEMPLATE_DIR" ]; then
        start_server "$core" template "$TEMPLATE_DIR" server.app:app
    else
        printf '%s\t%s\t%s\t%s\n' "$core" template failed "openenv init failed" >>"$TMP/results/servers.tsv"
    fi
    if [ -n "$ECHO_DIR" ]; then
        start_server "$core" echo "$ECHO_DIR" server.app:app "$(dirname "$ECHO_DIR")"
    else
        printf '%s\t%s\t%s\t%s\n' "$core" echo skipped "UPSTREAM_ECHO_ENV_DIR not set" >>"$TMP/results/servers.tsv"
    fi
done

log "starting ${#SERVERS[@]} servers: ${SERVERS[*]}"
UP=()
deadline=$((SECONDS + START_TIMEOUT_S))
pending=("${SERVERS[@]}")
while [ "${#pending[@]}" -gt 0 ]; do
    still=()
    for name in "${pending[@]}"; do
        core="${name%/*}"; kind="${name#*/}"
        if curl -fsS --max-time 2 "${URL[$name]}/health" >/dev/null 2>&1; then
            UP+=("$name")
            printf '%s\t%s\tup\t%s\n' "$core" "$kind" "${URL[$name]}" >>"$TMP/results/servers.tsv"
        elif ! kill -0 "${PID[$name]}" 2>/dev/null || [ "$SECONDS" -ge "$deadline" ]; then
            why="exited"; kill -0 "${PID[$name]}" 2>/dev/null && why="no /health within ${START_TIMEOUT_S} s"
            detail="$(grep -E 'Error|error' "$TMP/logs/server-$core-$kind.log" | tail -1)"
            printf '%s\t%s\tfailed\t%s: %s\n' "$core" "$kind" "$why" "$detail" >>"$TMP/results/servers.tsv"
            log "server $name ($why), last lines of its log:"
            tail -15 "$TMP/logs/server-$core-$kind.log" | sed 's/^/    /'
        else
            still+=("$name")
        fi
    done
    pending=("${still[@]}")
    [ "${#pending[@]}" -gt 0 ] && sleep 0.3
done
log "servers up after $((SECONDS - STARTED_AT)) s: ${UP[*]}"

# --- 3. drive every server with both clients ------------------------------------------------------
# One round per client core; in a round every server is driven at once (one driver per server).
# Each driver is a direct child of this shell, so cleanup() can end it by PID (timeout passes
# TERM on to python).
for client in ours upstream; do
    venv="$OURS_VENV"; [ "$client" = upstream ] && venv="$UPSTREAM_VENV"
    round=()
    for name in "${UP[@]}"; do
        core="${name%/*}"; kind="${name#*/}"
        extra=(); [ "$kind" = template ] && extra=(--template-dir "$TEMPLATE_DIR")
        (cd "$TMP" && exec timeout "$DRIVE_TIMEOUT_S" "$venv/bin/python" "$HERE/drive.py" "${URL[$name]}" "$kind" \
            --json "$TMP/results/${core}__${kind}__${client}.json" "${extra[@]}") \
            >"$TMP/logs/drive-${client}-client-${core}-${kind}.log" 2>&1 &
        DRIVER_PIDS+=("$!")
        round+=("$!:$TMP/logs/drive-${client}-client-${core}-${kind}.log")
    done
    for entry in "${round[@]}"; do
        wait "${entry%%:*}"
        echo "exit status $?" >>"${entry#*:}"
    done
done

# --- 4. report ----------------------------------------------------------------------------------
for name in "${UP[@]}"; do
    core="${name%/*}"; kind="${name#*/}"
    for client in ours upstream; do
        f="$TMP/logs/drive-${client}-client-${core}-${kind}.log"
        echo
        echo "### $client client -> $core server [$kind] (${URL[$name]})"
        if [ "${VERBOSE:-0}" = 1 ]; then
            cat "$f"
        else
            grep -vE '^  PASS ' "$f"
        fi
    done
done

"$OURS_VENV/bin/python" "$HERE/matrix.py" "$TMP/results"
FINAL_RC=$?
log "done in $((SECONDS - STARTED_AT)) s (after the venvs existed)"
exit "$FINAL_RC"
