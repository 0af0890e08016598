#!/usr/bin/env bash
# The tests of a lake on az:// start Azurite, the Azure Storage emulator: install it, and the
# Node.js 22 it runs on, from the npm registry into tools/azurite/node_modules (the versions in
# tools/azurite/package-lock.json), when the lock file changed since the last install. npm itself
# comes from Debian's packages when it is missing (as root, or with sudo otherwise).
set -eu
cd "$(dirname "$0")/azurite"
stamp=node_modules/.installed-stamp
if [ -f "$stamp" ] && [ "$stamp" -nt package-lock.json ] && [ -x node_modules/.bin/node ]; then
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "The tests of a lake on az:// need npm to install Azurite; install Node.js and npm, then run make again." >&2
    exit 1
  fi
  sudo=""
  if [ "$(id -u)" != "0" ]; then sudo="sudo"; fi
  echo "Installing npm (Debian package) for the Azure Storage emulator..."
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends npm
fi
echo "Installing Azurite and Node.js 22 (npm packages) into tools/azurite/node_modules..."
npm ci --omit=dev --no-audit --no-fund --loglevel=error
touch "$stamp"
