#!/usr/bin/env bash
# System tools the tests drive as a user would, installed when missing: kcat (Debian's
# package, librdkafka 2.0) for the Kafka listener's tests. Without it those tests say so
# loudly, and fail when CI is set.
set -uo pipefail
if command -v kcat >/dev/null 2>&1; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "tests/install_tools.sh: kcat is missing and there is no apt-get: install kcat yourself" >&2
    exit 0
fi
sudo=""
if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null 2>&1; then sudo="sudo -n"; else
        echo "tests/install_tools.sh: kcat is missing; run 'apt-get install kcat' as root" >&2
        exit 0
    fi
fi
if ! $sudo apt-get install -y -q kcat >/tmp/minibroker-apt.log 2>&1; then
    $sudo apt-get update -q >/tmp/minibroker-apt.log 2>&1 || true
    $sudo apt-get install -y -q kcat >>/tmp/minibroker-apt.log 2>&1 \
        || echo "tests/install_tools.sh: could not install kcat (see /tmp/minibroker-apt.log)" >&2
fi
exit 0
