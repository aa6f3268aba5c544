# shellcheck shell=bash disable=SC2034  # variables here are used by the scripts that source it
# Shared settings and helpers for build.sh / up.sh / down.sh. Sourced, never executed.
#
# Every path, name and address these scripts touch is derived here, so that up and down agree on
# what belongs to an instance, and so that nothing outside those names is ever touched.

# --- settings (environment) --------------------------------------------------------------------
# Cached rootfs (shared read-only lower layer of every instance; see up.sh --volatile=overlay).
DFLASH_TESTHOST_ROOTFS=${DFLASH_TESTHOST_ROOTFS:-/var/lib/machines/pytest-dflash-bookworm}
# One sub-directory per instance (its state dir), plus lock files. Scanned by up.sh to reap
# instances whose owner died.
DFLASH_TESTHOST_RUNDIR=${DFLASH_TESTHOST_RUNDIR:-/run/pytest-dflash-testhost}
# Host-side download caches (wheels for the guest venv, .debs for debootstrap).
DFLASH_TESTHOST_CACHE=${DFLASH_TESTHOST_CACHE:-/var/cache/pytest-dflash-testhost}

# Where the guest venv lives inside the rootfs, and where the checkout is bind-mounted.
GUEST_VENV=/opt/dflash-venv
GUEST_CHECKOUT=/opt/pytest-dflash

# Instance names: netns name, nspawn machine name (= guest hostname) and cgroup "ci-<name>".
NAME_RE='^[a-z][a-z0-9-]{1,30}$'

# --- logging and timing ------------------------------------------------------------------------
_tprog=${0##*/}
log() { printf '[testhost %s] %s\n' "$_tprog" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
now() { printf '%s' "$EPOCHREALTIME"; }
# elapsed START -> "1.23" seconds since START (an EPOCHREALTIME value)
elapsed() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }'; }

# usage: the script's header comment (up to its first non-comment or shellcheck line)
usage() { awk 'NR == 1 { next } /^# shellcheck/ || !/^#/ { exit } { sub(/^# ?/, ""); print }' "$0"; }
need_root() { [[ $EUID -eq 0 ]] || die "must run as root (netns, cgroups, systemd-nspawn)"; }

# --- processes ---------------------------------------------------------------------------------
alive() { [[ -n ${1:-} ]] && kill -0 "$1" 2>/dev/null; }
# starttime of a PID (field 22 of /proc/PID/stat, clock ticks since boot). Recorded next to every
# PID we store so that a recycled PID is never mistaken for ours.
starttime() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }                          # drop "pid (comm) ", comm may contain spaces
  # shellcheck disable=SC2086
  set -- $stat
  printf '%s' "${20}"                        # field 22 overall = 20th after pid and comm
}
# running PID: alive and not a zombie (with a PID 1 that is slow to reap, a killed process can
# linger as one, and kill -0 still succeeds on it)
running() {
  local stat
  alive "$1" || return 1
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  [[ ${stat:0:1} != Z ]]
}
# same_proc PID STARTTIME: true if PID runs and is the very process we recorded
same_proc() { running "$1" && [[ $(starttime "$1") == "$2" ]]; }
comm_of() { cat "/proc/$1/comm" 2>/dev/null; }
ppid_of() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  # shellcheck disable=SC2086
  set -- $stat
  printf '%s' "$2"
}

# --- cgroups -----------------------------------------------------------------------------------
# The only layout this is tested on: hybrid v1 + name=systemd + cgroup2 at /sys/fs/cgroup/unified,
# with a host PID 1 that is NOT systemd (nobody else manages these trees). Prints the hierarchy
# roots where up.sh creates ci-<name>/, or fails with the reason.
cgroup_roots() {
  [[ $(stat -fc %T /sys/fs/cgroup 2>/dev/null) != cgroup2fs ]] ||
    { echo "pure cgroup v2 host: untested layout (see docs/testhost.md)" >&2; return 1; }
  [[ $(stat -fc %T /sys/fs/cgroup/unified 2>/dev/null) == cgroup2fs ]] ||
    { echo "no cgroup2 at /sys/fs/cgroup/unified (need the hybrid layout)" >&2; return 1; }
  [[ -f /sys/fs/cgroup/systemd/cgroup.procs ]] ||
    { echo "no name=systemd hierarchy at /sys/fs/cgroup/systemd" >&2; return 1; }
  [[ $(comm_of 1) != systemd ]] ||
    { echo "host PID 1 is systemd: it owns the cgroup tree; this recipe is not for such hosts" >&2; return 1; }
  printf '%s\n' /sys/fs/cgroup/unified /sys/fs/cgroup/systemd
}

# --- instance state ----------------------------------------------------------------------------
# state_get DIR KEY -> value from DIR/instance.env (KEY=VALUE lines, values never contain spaces)
state_get() { sed -n "s/^$2=//p" "$1/instance.env" 2>/dev/null | tail -n1; }
state_set() { printf '%s=%s\n' "$2" "$3" >>"$1/instance.env"; }

# owner_alive DIR: the process that asked for the instance still runs (PID + starttime match).
# "none" = a pinned instance nobody reaps (up.sh --owner none).
owner_alive() {
  local pid st
  pid=$(state_get "$1" OWNER_PID); st=$(state_get "$1" OWNER_START)
  [[ $pid == none ]] && return 0
  [[ -n $pid ]] && same_proc "$pid" "$st"
}
