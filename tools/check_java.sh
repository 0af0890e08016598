#!/usr/bin/env bash
# Spark needs a Java 17+ runtime; say how to get one instead of failing deep inside PySpark.
set -u
if ! command -v java >/dev/null 2>&1 && [ -z "${JAVA_HOME:-}" ]; then
  echo "Java 17 or newer is required by Spark and none was found." >&2
  echo "Install it, e.g.: sudo apt-get install -y openjdk-17-jre-headless (Debian/Ubuntu)," >&2
  echo "brew install openjdk@17 (macOS), then run make again." >&2
  exit 1
fi
java_bin="${JAVA_HOME:+$JAVA_HOME/bin/}java"
version=$("$java_bin" -version 2>&1 | awk -F'"' '/version/ {print $2; exit}')
major=${version%%.*}
if [ "$major" = "1" ]; then major=$(echo "$version" | cut -d. -f2); fi
if ! [ "$major" -ge 17 ] 2>/dev/null; then
  echo "Java $version found; Spark 4 needs Java 17 or newer." >&2
  echo "Install it, e.g.: sudo apt-get install -y openjdk-17-jre-headless, and set JAVA_HOME." >&2
  exit 1
fi
