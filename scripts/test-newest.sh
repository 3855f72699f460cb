#!/usr/bin/env bash
# The server tests against the NEWEST releases of the libraries whose private internals OpenEnv
# relies on (`make test-newest`, run by CI after `make test`).
#
# pyproject.toml bounds uvicorn, websockets and fastmcp at the releases CI tests; this script
# installs the project into its own venv (.venv-newest, reused when present), then force-upgrades
# uvicorn, websockets, fastmcp (and mcp), fastapi and starlette to their newest releases, past our
# bounds if they are (pip warns about the conflict: that is the point). A release past the bounds
# must leave the server working, with the version-gated fast paths switched off by themselves.
# Prints the versions it ended up with and whether each fast path is on, then runs the server
# tests under a wall-clock bound; exits non-zero if any step fails or times out.
#
# Environment: PYTHON (interpreter for the venv, default python3), NEWEST_VENV (default
# <root>/.venv-newest), TEST_TIMEOUT_S (pytest's wall-clock bound, default 600),
# INSTALL_TIMEOUT_S (per pip step, default 600), PYTEST_ARGS (extra pytest arguments).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"
VENV="${NEWEST_VENV:-$ROOT/.venv-newest}"
PY="$VENV/bin/python"
STAMP="$VENV/.installed"
TEST_TIMEOUT_S="${TEST_TIMEOUT_S:-600}"
INSTALL_TIMEOUT_S="${INSTALL_TIMEOUT_S:-600}"

# The libraries upgraded past our bounds (uvicorn with its [standard] extras, as we depend on it).
NEWEST=("uvicorn[standard]" websockets "fastmcp-slim[server]" mcp fastapi starlette)
# The tests of the server, its protocols and the code paths gated by those libraries' versions.
TESTS=(
    tests/test_ws_protocol.py
    tests/test_ws_transport.py
    tests/test_http_routes.py
    tests/test_http_faults.py
    tests/test_mcp.py
    tests/test_mcp_faults.py
    tests/test_session_faults.py
    tests/test_client.py
    tests/test_echo_env.py
    tests/security/test_hostile_clients.py
    tests/test_resume.py
    tests/test_mcp_context.py
    tests/test_session_reach.py
    tests/test_dispatch.py
    tests/security/test_served_any_way.py
)

# Nothing from the caller's shell may switch a fast path off or change what is imported.
unset PYTHONPATH OPENENV_LIBRARY_INTERNALS OPENENV_WS_PLAIN_FRAMES OPENENV_CONNECTION_GUARD OPENENV_AUTH_TOKEN OPENENV_ERROR_DETAILS
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 PYTHONDONTWRITEBYTECODE=1

START=$SECONDS
step() { printf '\n[test-newest %3ds] %s\n' "$((SECONDS - START))" "$*"; }
fail() { printf '[test-newest] FAILED: %s\n' "$*" >&2; exit 1; }
pip_() { timeout --kill-after=30 "$INSTALL_TIMEOUT_S" "$PY" -m pip "$@" || fail "pip $* (rc $?)"; }

step "1/6 venv $VENV"
if [ -x "$PY" ] && "$PY" -c 'import sys' 2>/dev/null; then
    echo "reusing it ($("$PY" --version))"
else
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV" || fail "$PYTHON -m venv $VENV"
    rm -f "$STAMP"
    pip_ install --quiet --upgrade pip
fi

step "2/6 the project with its dev tools, and envs/echo_env (editable)"
if [ -f "$STAMP" ] && [ "$STAMP" -nt pyproject.toml ] && [ "$STAMP" -nt envs/echo_env/pyproject.toml ]; then
    echo "installed already (pyproject.toml unchanged since)"
else
    pip_ install --quiet -e ".[core,dev]" -e envs/echo_env
    touch "$STAMP"
fi

step "3/6 the newest ${NEWEST[*]} (past our bounds if need be)"
pip_ install --quiet --upgrade "${NEWEST[@]}"

step "4/6 what is installed"
"$PY" - <<'EOF'
from importlib.metadata import PackageNotFoundError, version

for name in ("uvicorn", "websockets", "fastmcp-slim", "fastmcp", "mcp", "fastapi", "starlette", "httptools", "uvloop", "pydantic", "httpx"):
    try:
        print(f"  {name:<11} {version(name)}")
    except PackageNotFoundError:
        print(f"  {name:<11} (not installed)")
# The version gates: off on a release past the tested ranges. Each _compat module names its own
# (tested()).
import importlib

for lib in ("uvicorn", "websockets", "fastmcp"):
    try:
        module = importlib.import_module(f"openenv.core.env_server._compat.{lib}")
    except ModuleNotFoundError:
        continue
    except Exception as exc:  # report, the tests still decide
        print(f"  fast path on {lib}'s internals: ? (import failed: {exc!r})")
        continue
    gate = getattr(module, "tested", None)
    ranges = getattr(module, "TESTED_UVICORN", None) or getattr(module, "TESTED_MAJORS", None)
    try:
        state = "?" if gate is None else ("on" if gate() else "OFF")
    except Exception as exc:  # report, the tests still decide
        state = f"? ({exc!r})"
    print(f"  fast path on {lib}'s internals: {state} (tested: {ranges})")
EOF
echo "pip check (conflicts with our upper bounds are expected here):"
"$PY" -m pip check 2>&1 | sed 's/^/  /' || true

run_tests() {  # $1: what the run is, for the messages; the environment says how to serve
    local rc=0
    # shellcheck disable=SC2086
    timeout --kill-after=30 "$TEST_TIMEOUT_S" "$PY" -m pytest -q -p no:cacheprovider ${PYTEST_ARGS:-} "${TESTS[@]}" || rc=$?
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
        fail "the tests $1 ran past ${TEST_TIMEOUT_S}s"
    elif [ "$rc" != 0 ]; then
        fail "the tests $1 (pytest rc $rc)"
    fi
}

step "5/6 the server tests against the newest releases (bound: ${TEST_TIMEOUT_S}s)"
run_tests "against the newest releases"
# What a release past the tested ones gets: the libraries' public APIs only. The tests of what
# needs their internals are skipped (pytest.mark.internals); everything else must pass.
step "6/6 the same with OPENENV_LIBRARY_INTERNALS=0"
OPENENV_LIBRARY_INTERNALS=0 run_tests "with OPENENV_LIBRARY_INTERNALS=0"
step "passed in $((SECONDS - START))s"
