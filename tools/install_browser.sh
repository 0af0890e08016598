#!/usr/bin/env bash
# The end-to-end test drives the Dagster UI in headless Chromium: install Debian's chromium and
# its driver when they are missing (as root, or with sudo otherwise).
set -eu
if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "The end-to-end test needs /usr/bin/chromium and /usr/bin/chromedriver;" >&2
  echo "install Chromium and its matching chromedriver there, then run make again." >&2
  exit 1
fi
sudo=""
if [ "$(id -u)" != "0" ]; then sudo="sudo"; fi
echo "Installing chromium and chromium-driver (Debian packages) for the end-to-end test..."
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends chromium chromium-driver
