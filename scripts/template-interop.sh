#!/usr/bin/env bash
# Manual check that `openenv init`'s packages work on upstream OpenEnv 0.10.0 and on ours
# (`make template-interop`). Not a CI test: it downloads upstream from PyPI.
#
# Each template (typed, mcp) is rendered with this checkout's CLI as `my_env`, installed with its
# dependencies (`pip install -e my_env[dev]`) and its own tests are run (`pytest my_env/tests`):
#   upstream  into the upstream venv (.interop-venv, shared with scripts/interop.sh; created with
#             openenv==0.10.0 from PyPI if missing). The package is uninstalled again afterwards;
#             its [dev] extra leaves pytest and pytest-asyncio there.
#   ours      into a fresh venv, made for this run, where this checkout's source is installed first:
#             the package's `openenv>=0.10` must resolve to it, not to a release from PyPI.
# Before the tests, each venv must still hold the OpenEnv it started with, and `pip check` must pass.
# Prints a matrix (rows: template, columns: core, cells: passed/total) and exits non-zero if any
# install or test failed.
#
# Environment: PYTHON (interpreter for the venvs, default python3), UPSTREAM_VENV (another venv that
# has openenv==0.10.0, instead of .interop-venv), VERBOSE=1 (print the tests' output, not only the
# failures'), KEEP_TMP=1 (keep the temp dir with the packages, logs and our venv).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
UPSTREAM_VERSION=0.10.0
UPSTREAM_VENV="${UPSTREAM_VENV:-$ROOT/.interop-venv}"
TEMPLATES=(typed mcp)
CORES=(upstream ours)
INSTALL_TIMEOUT_S=900  # per pip install (ours: the first one fetches all of OpenEnv's dependencies)
TEST_TIMEOUT_S=300     # per pytest run

# Nothing from the caller's shell may change which core a process imports or how it serves.
unset PYTHONPATH VIRTUAL_ENV ENABLE_WEB_INTERFACE OPENENV_MODE OPENENV_CLIENT_MODE OPENENV_STEP_TIMEOUT_S MAX_CONCURRENT_ENVS
export PYTHONDONTWRITEBYTECODE=1 PIP_DISABLE_PIP_VERSION_CHECK=1 NO_PROXY="127.0.0.1,localhost" no_proxy="127.0.0.1,localhost"

log() { printf '[template-interop] %s\n' "$*"; }

TMP="$(mktemp -d -t openenv-template-interop.XXXXXX)"
mkdir -p "$TMP/logs"
FINAL_RC=1
UPSTREAM_INSTALLED=""  # the package currently installed into the upstream venv, to remove on exit

cleanup() {
    if [ -n "$UPSTREAM_INSTALLED" ]; then
        "$UPSTREAM_VENV/bin/python" -m pip uninstall --quiet --yes "$UPSTREAM_INSTALLED" >/dev/null 2>&1
    fi
    if [ "${KEEP_TMP:-0}" = 1 ] || [ "$FINAL_RC" != 0 ]; then
        log "logs kept in $TMP/logs"
    else
        rm -rf "$TMP"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# core_version VENV: the version of the openenv distribution installed in VENV and where it lives.
core_version() {
    "$1/bin/python" - <<'EOF' 2>/dev/null
import os
from importlib.metadata import distribution

import openenv

print(distribution("openenv").version, os.path.dirname(os.path.dirname(os.path.abspath(openenv.__file__))))
EOF
}

# --- 1. the two venvs -------------------------------------------------------------------------------
if ! "$UPSTREAM_VENV/bin/python" - "$UPSTREAM_VERSION" 2>/dev/null <<'EOF'
import sys
from importlib.metadata import version
sys.exit(version("openenv") != sys.argv[1])
EOF
then
    if [ "$UPSTREAM_VENV" != "$ROOT/.interop-venv" ]; then
        log "UPSTREAM_VENV=$UPSTREAM_VENV has no openenv==$UPSTREAM_VERSION"; exit 1
    fi
    log "creating .interop-venv with openenv==$UPSTREAM_VERSION from PyPI (once; pulls gradio & co.)"
    rm -rf "$UPSTREAM_VENV"
    "${PYTHON:-python3}" -m venv "$UPSTREAM_VENV" || exit 1
    "$UPSTREAM_VENV/bin/python" -m pip install --quiet --upgrade pip || exit 1
    "$UPSTREAM_VENV/bin/python" -m pip install --quiet "openenv==$UPSTREAM_VERSION" || exit 1
fi

OURS_VENV="$TMP/ours-venv"
SOURCE="$TMP/openenv-src"  # a copy, so that building it writes nothing into the checkout
mkdir -p "$SOURCE"
cp pyproject.toml README.md "$SOURCE/"
cp -R src "$SOURCE/src" || exit 1
find "$SOURCE/src" \( -name __pycache__ -o -name '*.egg-info' \) -prune -exec rm -rf {} +
log "creating a fresh venv with this checkout's openenv (from $SOURCE)"
STARTED_AT=$SECONDS
"${PYTHON:-python3}" -m venv "$OURS_VENV" || exit 1
if ! timeout "$INSTALL_TIMEOUT_S" "$OURS_VENV/bin/python" -m pip install --quiet "$SOURCE" >"$TMP/logs/install-ours-core.log" 2>&1; then
    log "installing our openenv failed:"; tail -20 "$TMP/logs/install-ours-core.log"; exit 1
fi
declare -A VENV CORE_AT_START
VENV[upstream]="$UPSTREAM_VENV"
VENV[ours]="$OURS_VENV"
for core in "${CORES[@]}"; do
    CORE_AT_START[$core]="$(core_version "${VENV[$core]}")"
done
log "upstream: openenv ${CORE_AT_START[upstream]}"
log "ours:     openenv ${CORE_AT_START[ours]}   (fresh venv ready after $((SECONDS - STARTED_AT)) s)"

# --- 2. render, install, test -----------------------------------------------------------------------
declare -A CELL
for template in "${TEMPLATES[@]}"; do
    dir="$TMP/$template"
    if ! "$OURS_VENV/bin/openenv" init my_env --template "$template" --output-dir "$dir" >"$TMP/logs/init-$template.log" 2>&1; then
        log "openenv init my_env --template $template failed:"; tail -20 "$TMP/logs/init-$template.log"
        for core in "${CORES[@]}"; do CELL[$template/$core]="init failed"; done
        continue
    fi
    requirements="$("$OURS_VENV/bin/python" -c 'import sys, tomllib; print(", ".join(tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]))' "$dir/my_env/pyproject.toml" 2>/dev/null)"
    log "$template: requires ${requirements:-?}"
    for core in "${CORES[@]}"; do
        venv="${VENV[$core]}"
        name="$template-$core"
        [ "$core" = upstream ] && UPSTREAM_INSTALLED="openenv-my-env"
        if ! (cd "$dir" && timeout "$INSTALL_TIMEOUT_S" "$venv/bin/python" -m pip install --quiet -e "my_env[dev]") \
                >"$TMP/logs/install-$name.log" 2>&1; then
            log "$name: pip install -e my_env[dev] failed:"; grep -vE '^WARNING: Location' "$TMP/logs/install-$name.log" | tail -20
            CELL[$template/$core]="install failed"
            continue
        fi
        now="$(core_version "$venv")"
        if [ "$now" != "${CORE_AT_START[$core]}" ]; then
            log "$name: installing the package changed the core: openenv ${CORE_AT_START[$core]} -> $now"
            CELL[$template/$core]="core changed"
            continue
        fi
        if ! "$venv/bin/python" -m pip check >"$TMP/logs/pip-check-$name.log" 2>&1; then
            log "$name: pip check found conflicts:"; cat "$TMP/logs/pip-check-$name.log"
            CELL[$template/$core]="pip check failed"
            continue
        fi
        fastmcp="$("$venv/bin/python" -m pip list 2>/dev/null | awk 'tolower($1) ~ /^fastmcp/ {printf "%s %s  ", $1, $2}')"
        [ -n "$fastmcp" ] && log "$name: $fastmcp"
        (cd "$dir/my_env" && timeout "$TEST_TIMEOUT_S" "$venv/bin/python" -m pytest -q -p no:cacheprovider \
            --junitxml="$TMP/logs/junit-$name.xml" tests) >"$TMP/logs/pytest-$name.log" 2>&1
        rc=$?
        CELL[$template/$core]="$("$OURS_VENV/bin/python" - "$TMP/logs/junit-$name.xml" <<'EOF' 2>/dev/null || echo "no result"
import sys
import xml.etree.ElementTree as ET

root = ET.parse(sys.argv[1]).getroot()
suites = [root] if root.tag == "testsuite" else list(root)
total = sum(int(s.get("tests", 0)) for s in suites)
bad = sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) + int(s.get("skipped", 0)) for s in suites)
print(f"{total - bad}/{total}")
EOF
)"
        if [ "$rc" != 0 ] || [ "${VERBOSE:-0}" = 1 ]; then
            echo; echo "### $template template on $core (pytest exit status $rc)"; tail -60 "$TMP/logs/pytest-$name.log"
        fi
        [ "$rc" != 0 ] && CELL[$template/$core]="${CELL[$template/$core]} (exit $rc)"
        if [ "$core" = upstream ]; then
            "$venv/bin/python" -m pip uninstall --quiet --yes openenv-my-env >/dev/null 2>&1
            UPSTREAM_INSTALLED=""
        fi
    done
done

# --- 3. report ----------------------------------------------------------------------------------
echo
printf '%-10s %-24s %-24s\n' "template" "upstream ${CORE_AT_START[upstream]%% *}" "ours ${CORE_AT_START[ours]%% *}"
FINAL_RC=0
for template in "${TEMPLATES[@]}"; do
    printf '%-10s' "$template"
    for core in "${CORES[@]}"; do
        cell="${CELL[$template/$core]:-not run}"
        printf ' %-24s' "$cell"
        if ! [[ "$cell" =~ ^([0-9]+)/([0-9]+)$ ]] || [ "${BASH_REMATCH[1]}" != "${BASH_REMATCH[2]}" ] || [ "${BASH_REMATCH[2]}" = 0 ]; then
            FINAL_RC=1
        fi
    done
    echo
done
log "done in $((SECONDS - STARTED_AT)) s (after the upstream venv existed)"
exit "$FINAL_RC"
