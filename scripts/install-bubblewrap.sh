#!/usr/bin/env bash
# Make sure bubblewrap (bwrap), which the sandbox needs, is installed; install it when we can.
set -u
if command -v bwrap >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing bubblewrap (the sandbox's namespaces tool) ..."
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q bubblewrap >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q bubblewrap >/dev/null 2>&1; }
fi
if command -v bwrap >/dev/null 2>&1; then
    echo "bubblewrap installed: $(bwrap --version)"
else
    echo "note: bubblewrap is not installed and could not be installed here; sandboxes need it"
    echo "      (Debian/Ubuntu: sudo apt-get install bubblewrap; Fedora: sudo dnf install bubblewrap)."
    echo "      Without it, SandboxProvider(..., isolation='none') runs environments unsandboxed."
fi
exit 0
