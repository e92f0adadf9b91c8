#!/usr/bin/env bash
# Check llmgw's Prometheus alert rules: `promtool check rules` (syntax, templates) and
# `promtool test rules` (monitoring/tests/: each alert fires, and stays quiet, when it
# should). promtool comes with Debian's `prometheus` package; as root this script installs
# it when missing (the package's server is stopped again if the install started it).
#
#   monitoring/check.sh          from anywhere; exits non-zero on any failure
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PROMTOOL="${PROMTOOL:-promtool}"

install_promtool() {
  if [ "$(id -u)" -ne 0 ]; then
    echo "promtool is not installed; install Debian's prometheus package as root" \
      "(apt-get install -y prometheus) or set PROMTOOL=/path/to/promtool" >&2
    exit 1
  fi
  command -v apt-get >/dev/null || {
    echo "promtool is not installed and there is no apt-get here; install promtool" \
      "(Prometheus' release tarball has it) and set PROMTOOL=/path/to/promtool" >&2
    exit 1
  }
  echo "installing promtool (Debian package prometheus)"
  # Keep the install from starting a Prometheus server here (the package enables it).
  local had_policy=0
  [ -e /usr/sbin/policy-rc.d ] && had_policy=1
  if [ "$had_policy" -eq 0 ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
    chmod 0755 /usr/sbin/policy-rc.d
  fi
  local rc=0
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus \
    >/tmp/llmgw-promtool-install.log 2>&1 || rc=$?
  if [ "$rc" -ne 0 ]; then
    # An old package list: refresh it and try once more.
    { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y \
        --no-install-recommends prometheus; } >>/tmp/llmgw-promtool-install.log 2>&1 || rc=$?
    command -v promtool >/dev/null && rc=0
  fi
  [ "$had_policy" -eq 0 ] && rm -f /usr/sbin/policy-rc.d
  if [ "$rc" -ne 0 ] || ! command -v promtool >/dev/null; then
    tail -20 /tmp/llmgw-promtool-install.log >&2
    echo "installing the prometheus package failed (log: /tmp/llmgw-promtool-install.log)" >&2
    exit 1
  fi
}

if ! command -v "$PROMTOOL" >/dev/null; then
  if [ "$PROMTOOL" = promtool ]; then
    install_promtool
  else
    echo "PROMTOOL=$PROMTOOL is not an executable" >&2
    exit 1
  fi
fi

"$PROMTOOL" --version 2>&1 | head -1
"$PROMTOOL" check rules "$HERE/alerts.yml"
"$PROMTOOL" test rules "$HERE/tests/alerts_test.yml"
