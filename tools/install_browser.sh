#!/usr/bin/env bash
# The end-to-end test drives the Dagster UI in headless Chromium: install Debian's chromium and
# its driver when they are missing.
set -eu
if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then
  exit 0
fi
bash "$(dirname "$0")/apt_install.sh" "the end-to-end test (/usr/bin/chromium and /usr/bin/chromedriver)" \
  chromium chromium-driver
