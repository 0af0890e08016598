#!/usr/bin/env bash
# The tests of a lake on az:// start Azurite, the Azure Storage emulator: install it, and the
# Node.js 22 it runs on, from the npm registry into tools/azurite/node_modules (the versions in
# tools/azurite/package-lock.json), when the lock file changed since the last install. npm itself
# comes from Debian's packages when it is missing.
set -eu
cd "$(dirname "$0")/azurite"
stamp=node_modules/.installed-stamp
if [ -f "$stamp" ] && [ "$stamp" -nt package-lock.json ] && [ -x node_modules/.bin/node ]; then
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  bash ../apt_install.sh "the tests of a lake on az:// (npm, to install Azurite)" npm
fi
echo "Installing Azurite and Node.js 22 (npm packages) into tools/azurite/node_modules..."
npm ci --omit=dev --no-audit --no-fund --loglevel=error
touch "$stamp"
