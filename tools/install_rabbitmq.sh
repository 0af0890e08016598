#!/usr/bin/env bash
# The broker drain benchmark measures RabbitMQ on this machine: install Debian's rabbitmq-server
# when it is missing (as root, or with sudo otherwise). The benchmark starts a private node of its
# own; the system service the package may start is stopped and disabled so it holds no port.
set -eu
if [ -x /usr/sbin/rabbitmq-server ] || [ -x /usr/lib/rabbitmq/bin/rabbitmq-server ]; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "The broker benchmark needs rabbitmq-server (3.10+, with quorum queues) on PATH;" >&2
  echo "install it, then run the benchmark again." >&2
  exit 1
fi
sudo=""
if [ "$(id -u)" != "0" ]; then sudo="sudo"; fi
echo "Installing rabbitmq-server (Debian package) for the broker drain benchmark..." >&2
$sudo apt-get update -qq
# policy-rc.d 101: the package's post-install must not start a system-wide node on the default ports.
policy=/usr/sbin/policy-rc.d
made_policy=""
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' | $sudo tee "$policy" >/dev/null
  $sudo chmod +x "$policy"
  made_policy=1
fi
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends rabbitmq-server >&2
if [ -n "$made_policy" ]; then $sudo rm -f "$policy"; fi
