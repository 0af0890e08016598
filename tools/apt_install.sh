#!/usr/bin/env bash
# Install Debian packages for a purpose, as root or with sudo otherwise:
#   bash tools/apt_install.sh "WHAT NEEDS THEM" PACKAGE...
# Exits 1 naming what is missing when the machine has no apt-get.
set -eu
purpose=$1
shift
if ! command -v apt-get >/dev/null 2>&1; then
  echo "$purpose needs the Debian packages $*; install their equivalents, then run make again." >&2
  exit 1
fi
sudo=""
if [ "$(id -u)" != "0" ]; then sudo="sudo"; fi
echo "Installing $* (Debian packages) for $purpose..."
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "$@"
