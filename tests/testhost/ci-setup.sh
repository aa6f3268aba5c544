#!/usr/bin/env bash
# For .ci/run, before the test command: make this machine able to boot test hosts, so that the
# testhost tests RUN (with DFLASH_REQUIRE_TESTHOST=1 they fail instead of skipping otherwise).
#   - host packages (systemd-container, debootstrap, ...) if missing
#   - the cached rootfs + guest venv (cold ~1m40s on 2 cores; reused when current, < 1 s)
#   - removal of instances left behind by killed earlier runs (their owner process is gone)
# Usage (in .ci/run):
#   bash tests/testhost/ci-setup.sh
#   DFLASH_REQUIRE_TESTHOST=1 .venv/bin/pytest ...
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
t0=$EPOCHREALTIME
[[ $EUID -eq 0 ]] || { echo "ci-setup.sh: must run as root" >&2; exit 1; }
"$here/build.sh"
"$here/down.sh" --stale
printf '[testhost ci-setup.sh] ready in %.1fs\n' "$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { print b - a }')" >&2
