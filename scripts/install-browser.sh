#!/usr/bin/env bash
# Make sure a headless browser for the web playground's tests (tests/test_web.py) is installed:
# Debian's chromium and its chromedriver, which Selenium drives (nothing is downloaded at run time).
set -u
if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing chromium and chromium-driver (the web playground's browser tests) ..."
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q chromium chromium-driver >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium chromium-driver >/dev/null 2>&1; }
fi
if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
    echo "browser installed: $(chromedriver --version | head -1)"
else
    echo "note: chromium and chromedriver are not installed and could not be installed here;"
    echo "      the web playground's browser tests skip (Debian/Ubuntu: sudo apt-get install chromium chromium-driver)."
fi
exit 0
