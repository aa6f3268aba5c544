#!/usr/bin/env bash
# Prepare a machine ahead of test runs (a CI image): optional, the testhost and container fixtures build the
# rootfs themselves (build.sh) and up.sh reaps stale instances; .ci/run does not call it.
#   - host packages (systemd-container, debootstrap, ...) if missing
#   - the cached rootfs + guest venv (cold ~1m40s on 2 cores; reused when current, < 1 s)
#   - removal of instances left behind by killed earlier runs (their owner process is gone)
# Usage:
#   bash tests/testhost/ci-setup.sh
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
t0=$EPOCHREALTIME
[[ $EUID -eq 0 ]] || { echo "ci-setup.sh: must run as root" >&2; exit 1; }
"$here/build.sh"
"$here/down.sh" --stale
printf '[testhost ci-setup.sh] ready in %.1fs\n' "$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { print b - a }')" >&2
