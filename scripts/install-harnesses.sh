#!/usr/bin/env bash
# Install the agent CLIs ("harnesses") that the capture-proxy tests run unchanged, into a
# project-local cache, pinned, idempotent and safe to run concurrently.
#
#   scripts/install-harnesses.sh [--check] [NAME|npm|python|all ...]      (default: all)
#
# NAME: codex claude-code gemini-cli opencode (npm) | mini-swe-agent smolagents aider-chat (PyPI).
# Where: $OPENENV_HARNESS_DIR, default <repo>/.harnesses:
#   npm/                  one `npm install` of scripts/harnesses/package.json + package-lock.json
#   venv-<name>/          one venv per PyPI harness, from scripts/harnesses/python-<name>.txt (a full
#                         pin list: these packages pin conflicting deps, aider-chat downgrades ~50 of
#                         ours, so none of them goes into the project's .venv)
#   bin/<command>         a link to each working executable: codex claude gemini opencode mini
#                         smolagent aider (the tests look here)
#   *.installed           stamps (npm.installed, venv-<name>.installed): a hash of the manifests and
#                         the node/python version; a matching stamp with its executables in place
#                         means nothing is installed
# Like install-browser.sh it exits 0 when something cannot be installed (no registry, no node): it
# says why, and the tests that need that harness skip. --check installs nothing and exits 1 when a
# requested harness is missing.
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SPEC="$ROOT/scripts/harnesses"
DIR="${OPENENV_HARNESS_DIR:-$ROOT/.harnesses}"
NPM_NAMES="codex claude-code gemini-cli opencode"
PY_NAMES="mini-swe-agent smolagents aider-chat"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 NPM_CONFIG_UPDATE_NOTIFIER=false NPM_CONFIG_FUND=false NPM_CONFIG_AUDIT=false

check_only=0
wanted=""
for arg in "$@"; do
    case "$arg" in
        --check) check_only=1 ;;
        all) wanted="$wanted $NPM_NAMES $PY_NAMES" ;;
        npm) wanted="$wanted $NPM_NAMES" ;;
        python) wanted="$wanted $PY_NAMES" ;;
        codex | claude-code | gemini-cli | opencode | mini-swe-agent | smolagents | aider-chat) wanted="$wanted $arg" ;;
        -h | --help) sed -n '2,20p' "$0"; exit 0 ;;
        *) echo "install-harnesses: unknown harness '$arg'" >&2; exit 2 ;;
    esac
done
[ -n "$wanted" ] || wanted="$NPM_NAMES $PY_NAMES"
wanted="$(echo $wanted | tr ' ' '\n' | awk '!seen[$0]++' | tr '\n' ' ')"

# the command each harness puts in bin/, and where it comes from
commands_of() {
    case "$1" in
        codex) echo codex ;; claude-code) echo claude ;; gemini-cli) echo gemini ;; opencode) echo opencode ;;
        mini-swe-agent) echo mini ;; smolagents) echo smolagent ;; aider-chat) echo aider ;;
    esac
}
source_of() { # harness command -> the executable the link points at
    case "$1" in
        codex | claude-code | gemini-cli | opencode) echo "$DIR/npm/node_modules/.bin/$2" ;;
        *) echo "$DIR/venv-$1/bin/$2" ;;
    esac
}
version_of() { # harness -> its version when its executable is in place and runs; else empty
    local h="$1" exe
    exe="$(source_of "$h" "$(commands_of "$h")")"
    [ -x "$exe" ] || return 0
    case "$h" in
        mini-swe-agent | smolagents | aider-chat) # the installed distribution, and the command starts
            HOME="$DIR/.home" timeout 120 "$exe" --help </dev/null >/dev/null 2>&1 || return 0
            "$DIR/venv-$h/bin/python" -c "import importlib.metadata as m; print(m.version('$h'))" 2>/dev/null ;;
        *) HOME="$DIR/.home" timeout 60 "$exe" --version </dev/null 2>/dev/null | grep -m1 -oE '[0-9]+\.[0-9]+\.[0-9]+' ;;
    esac
}
wants() { case " $wanted " in *" $1 "*) return 0 ;; esac; return 1; }
wants_any() { local n; for n in "$@"; do wants "$n" && return 0; done; return 1; }
hash_of() { cat "$@" 2>/dev/null | sha256sum | cut -c1-32; }

link_all() { # bin/<command> for each wanted harness that runs (VERSIONS[h] set), none for the others
    local h c
    mkdir -p "$DIR/bin" "$DIR/.home"
    for h in $wanted; do
        c="$(commands_of "$h")"
        VERSIONS[$h]="$(version_of "$h")"
        if [ -n "${VERSIONS[$h]}" ]; then ln -sfn "$(source_of "$h" "$c")" "$DIR/bin/$c"; else rm -f "$DIR/bin/$c"; fi
    done
}

# --- npm ------------------------------------------------------------------------------------------

node_ok() { # the CLIs need node >= 20 (gemini-cli); codex, claude and opencode are native binaries
    command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 || return 1
    [ "$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)" -ge 20 ]
}

install_npm() {
    local stamp="$DIR/npm.installed" want h
    want="$(hash_of "$SPEC/package.json" "$SPEC/package-lock.json") node$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null)"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
        local ok=1
        for h in $NPM_NAMES; do [ -x "$(source_of "$h" "$(commands_of "$h")")" ] || ok=0; done
        [ "$ok" = 1 ] && return 0
    fi
    if ! node_ok && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "installing nodejs and npm (Debian's) for the agent CLIs ..."
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q nodejs npm >/dev/null 2>&1 ||
            { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q nodejs npm >/dev/null 2>&1; }
    fi
    if ! node_ok; then
        echo "note: node >= 20 and npm are needed for codex, claude-code, gemini-cli and opencode; they are not installed."
        return 0
    fi
    echo "installing the npm agent CLIs into $DIR/npm (pinned by scripts/harnesses/package-lock.json) ..."
    rm -rf "$DIR/npm" "$stamp"
    mkdir -p "$DIR/npm"
    cp "$SPEC/package.json" "$SPEC/package-lock.json" "$DIR/npm/"
    # `npm install`, not `npm ci`: the registry lacks some other-platform optional packages that opencode-ai
    # names, which `npm ci` refuses; the exact versions in package.json and the lock still pin what installs.
    # The packages' own install scripts only place each CLI's native binary (no download).
    if ! (cd "$DIR/npm" && timeout 1200 npm install --no-audit --no-fund --loglevel=error >"$DIR/npm-install.log" 2>&1); then
        echo "note: npm install failed (is the npm registry reachable?); see $DIR/npm-install.log:"
        tail -5 "$DIR/npm-install.log" | sed 's/^/      /'
        return 0
    fi
    echo "$want" >"$stamp"
}

# --- PyPI -----------------------------------------------------------------------------------------

base_python() { # the interpreter under the project's .venv (aider-chat needs 3.10-3.12)
    if [ -n "${OPENENV_HARNESS_PYTHON:-}" ]; then echo "$OPENENV_HARNESS_PYTHON"; return; fi
    if [ -x "$ROOT/.venv/bin/python" ]; then
        "$ROOT/.venv/bin/python" -c 'import sys; print(getattr(sys, "_base_executable", sys.executable))'
        return
    fi
    command -v python3
}

install_python() { # name
    local name="$1" venv="$DIR/venv-$1" stamp="$DIR/venv-$1.installed" py want
    py="$(base_python)"
    want="$(hash_of "$SPEC/python-$name.txt") $("$py" -c 'import sys; print("py%d.%d" % sys.version_info[:2])')"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$(source_of "$name" "$(commands_of "$name")")" ]; then
        return 0
    fi
    echo "installing $name into $venv (pinned by scripts/harnesses/python-$name.txt) ..."
    rm -rf "$venv" "$stamp"
    if ! "$py" -m venv "$venv" >/dev/null 2>&1; then
        echo "note: '$py -m venv' failed; $name is not installed."
        return 0
    fi
    if ! timeout 1200 "$venv/bin/python" -m pip install --quiet -r "$SPEC/python-$name.txt" >"$DIR/pip-$name.log" 2>&1; then
        echo "note: pip install of $name failed (is PyPI reachable?); see $DIR/pip-$name.log:"
        tail -5 "$DIR/pip-$name.log" | sed 's/^/      /'
        rm -rf "$venv"
        return 0
    fi
    echo "$want" >"$stamp"
}

# --- main -----------------------------------------------------------------------------------------

mkdir -p "$DIR"
exec 9>"$DIR/.lock"
flock 9 # another run installing at the same time: wait for it, then find everything in place

if [ "$check_only" = 0 ]; then
    wants_any $NPM_NAMES && install_npm
    for h in $PY_NAMES; do wants "$h" && install_python "$h"; done
fi
declare -A VERSIONS
link_all

missing=0
for h in $wanted; do
    if [ -n "${VERSIONS[$h]}" ]; then
        echo "harness $h ${VERSIONS[$h]}: $DIR/bin/$(commands_of "$h")"
    else
        echo "harness $h: missing"
        missing=1
    fi
done
if [ "$check_only" = 1 ] && [ "$missing" = 1 ]; then exit 1; fi
exit 0
