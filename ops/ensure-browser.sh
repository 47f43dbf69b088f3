#!/usr/bin/env bash
# Make sure Debian's chromium and chromedriver are installed, for the viewer's browser
# tests (tests/server/test_viewer.py). Playwright's or selenium's own browser downloads
# cannot reach the internet here; Debian's packages can be installed by name.
set -euo pipefail
if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "ensure-browser: chromium is missing and installing it needs root" >&2
  exit 1
fi
echo "ensure-browser: installing chromium and chromium-driver" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq chromium chromium-driver >/dev/null
command -v chromium >/dev/null && command -v chromedriver >/dev/null
