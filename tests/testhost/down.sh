#!/usr/bin/env bash
# Tear down test-host instances made by up.sh. Idempotent. Removes only what the instance's state
# dir recorded (PIDs checked against their recorded start times, cgroup paths and names checked
# against the instance name), so it can never stop or delete anything else.
#
# Usage: down.sh NAME|STATE_DIR...   those instances
#        down.sh --stale             every instance whose owner process is gone (killed runs)
#        down.sh --all               every instance under $DFLASH_TESTHOST_RUNDIR
# Exit status 1 if something could not be removed (it says what).
#
# Handles the failure modes of a killed run:
#  - a SIGTERM sent to nspawn very early in the boot is lost (a PID-namespace init drops signals it
#    has no handler for yet): SIGTERM is resent every 5 s, 6 times, before SIGKILL;
#  - nspawn SIGKILLed earlier: the guest's systemd (PID 1) is orphaned and keeps running in
#    ci-NAME/payload: it gets SIGRTMIN+4 (poweroff), then SIGKILL (kills the whole PID namespace);
#  - processes still in the instance's own cgroups after that are SIGKILLed (they can only be its
#    own: nothing else is ever moved there).
# shellcheck source-path=SCRIPTDIR
set -uo pipefail            # no -e: teardown goes on past individual failures and reports them
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
source "$here/lib.sh"
need_root

# wait_gone PID TENTHS: true once PID has exited (a zombie has; polls every 0.1 s)
wait_gone() { local i; for ((i = 0; i < $2; i++)); do running "$1" || return 0; sleep 0.1; done; ! running "$1"; }
# wait_reaped PID TENTHS: give the parent time to reap the zombie. nspawn's parent is this machine's
# PID 1 once up.sh has exited, and that one reaps orphans only every second or so.
wait_reaped() { local i; for ((i = 0; i < $2; i++)); do alive "$1" || return 0; sleep 0.1; done; return 0; }

# Commands entered into the guest from outside (nsenter, i.e. exec_in_guest) live in the guest's PID
# namespace but not in its cgroups, so the guest's systemd cannot stop them. At poweroff
# systemd-shutdown SIGSTOPs every process of the namespace; nsenter, outside and waiting with
# WUNTRACED, then stops ITSELF for good and never reaps its child: shutdown hangs 90 s on that
# zombie, and the stopped nsenter stays on the host. A killed pytest leaves such commands behind.
# So before the poweroff: SIGKILL every process of the guest's PID namespace that is outside the
# guest's cgroups, and SIGCONT its nsenter parent so that it reaps it (the parent, being outside
# the namespace, is the only one that can: killing it first would hand the zombie to the host's
# PID 1). An nsenter that does not then exit gets SIGKILL.
kill_entered() {
  local name=$1 leader=$2 ns p pid ppid i victims=() parents=()
  ns=$(readlink "/proc/$leader/ns/pid") || return 0
  for p in /proc/[0-9]*; do
    pid=${p#/proc/}
    [[ $(readlink "$p/ns/pid" 2>/dev/null) == "$ns" ]] || continue
    grep -q "/ci-$name/" "$p/cgroup" 2>/dev/null && continue
    victims+=("$pid")
    ppid=$(ppid_of "$pid")
    if [[ -n $ppid && $(comm_of "$ppid") == nsenter && $(readlink "/proc/$ppid/ns/pid") != "$ns" ]]; then
      parents+=("$ppid")
    fi
  done
  ((${#victims[@]})) || return 0
  log "killing ${#victims[@]} process(es) entered into the guest from outside (nsenter): ${victims[*]}"
  for pid in "${victims[@]}"; do kill -KILL "$pid" 2>/dev/null; done
  for ppid in "${parents[@]}"; do kill -CONT "$ppid" 2>/dev/null; done
  for pid in "${victims[@]}"; do   # until reaped (a zombie still counts for the guest's shutdown)
    for ((i = 0; i < 30; i++)); do [[ -e /proc/$pid ]] || break; sleep 0.1; done
  done
  for ppid in "${parents[@]}"; do running "$ppid" && kill -KILL "$ppid" 2>/dev/null; done
  return 0
}

teardown() {
  local dir=${1%/} name rundir t rc=0 lockfd
  name=$(basename "$dir"); rundir=$(dirname "$dir")
  [[ $name =~ $NAME_RE ]] || { log "not an instance state dir: $dir"; return 1; }
  t=$(now)
  exec {lockfd}>"$rundir/.lock.$name"
  flock -w 120 "$lockfd" || { log "instance lock $rundir/.lock.$name busy for 120 s"; return 1; }
  if [[ ! -d $dir ]]; then
    log "instance '$name': nothing to do"
    rm -f "$rundir/.lock.$name"; exec {lockfd}>&-
    return 0
  fi
  local env_name; env_name=$(state_get "$dir" NAME)
  [[ -z $env_name || $env_name == "$name" ]] || { log "$dir records NAME=$env_name: refusing"; return 1; }

  # 1) processes: nspawn (clean poweroff), then an orphaned guest PID 1
  local nspid nsstart leader lstart
  nspid=$(state_get "$dir" NSPAWN_PID); nsstart=$(state_get "$dir" NSPAWN_START)
  leader=$(state_get "$dir" LEADER_PID); lstart=$(state_get "$dir" LEADER_START)
  local nspawn_ours=0 leader_ours=0
  [[ -n $nspid ]] && same_proc "$nspid" "$nsstart" && [[ $(comm_of "$nspid") == systemd-nspawn ]] && nspawn_ours=1
  if ((nspawn_ours)) && [[ -z $leader ]]; then   # up was killed before it recorded the guest PID 1
    local kid kids=()
    read -r -a kids <"/proc/$nspid/task/$nspid/children" 2>/dev/null
    for kid in "${kids[@]}"; do
      grep -q "/ci-$name/payload" "/proc/$kid/cgroup" 2>/dev/null && { leader=$kid; lstart=$(starttime "$kid"); }
    done
  fi
  [[ -n $leader ]] && same_proc "$leader" "$lstart" && grep -q "/ci-$name/payload" "/proc/$leader/cgroup" 2>/dev/null &&
    leader_ours=1
  ((leader_ours)) && kill_entered "$name" "$leader"
  if ((nspawn_ours)); then
    # nspawn turns SIGTERM into a poweroff request for the guest's systemd.
    local i
    for i in 1 2 3 4 5 6; do
      kill -TERM "$nspid" 2>/dev/null
      wait_gone "$nspid" 50 && break
      log "nspawn $nspid still running after SIGTERM #$i (lost early in boot?), resending"
    done
    if running "$nspid"; then log "nspawn $nspid ignored SIGTERM for 30 s: SIGKILL"; kill -KILL "$nspid"; wait_gone "$nspid" 30; fi
  fi
  if ((leader_ours)) && same_proc "$leader" "$lstart"; then
    log "guest PID 1 ($leader) orphaned: poweroff"
    kill -s RTMIN+4 "$leader" 2>/dev/null
    wait_gone "$leader" 200 || { log "guest PID 1 ($leader) still up after 20 s: SIGKILL"; kill -KILL "$leader"; wait_gone "$leader" 50; }
  fi
  [[ -n $nspid ]] && ((nspawn_ours)) && wait_reaped "$nspid" 50
  [[ -n $leader ]] && ((leader_ours)) && wait_reaped "$leader" 50

  # 2) cgroups: only the recorded ci-NAME dirs; whatever still runs in them is the instance's own
  local d procs p
  if [[ -f $dir/cgroups ]]; then
    while read -r d; do
      [[ $d =~ ^/sys/fs/cgroup/[a-z0-9_,=]+/ci-$name$ ]] || { log "skipping unexpected cgroup path '$d'"; continue; }
      [[ -d $d ]] || continue
      procs=$(find "$d" -name cgroup.procs -exec cat {} + 2>/dev/null | sort -u)
      if [[ -n $procs ]]; then
        log "killing leftover processes in $d: $(tr '\n' ' ' <<<"$procs")"
        for p in $procs; do kill -KILL "$p" 2>/dev/null; done
        for p in $procs; do wait_gone "$p" 30; done
      fi
      find "$d" -depth -type d -exec rmdir {} \; 2>/dev/null
      [[ -d $d ]] && { log "ERROR: cgroup $d could not be removed"; rc=1; }
    done <"$dir/cgroups"
  fi

  # 3) network: veth first (takes its netns peer with it at once), then the netns
  local veth netns
  veth=$(state_get "$dir" VETH); netns=$(state_get "$dir" NETNS)
  if [[ -n $veth ]] && ip link show "$veth" >/dev/null 2>&1; then
    if ! [[ $veth =~ ^dfh[0-9a-f]{8}$ ]] || ! ip link del "$veth"; then
      log "ERROR: could not delete veth $veth"; rc=1
    fi
  fi
  if [[ -n $netns && $netns == "$name" ]] && [[ -e /run/netns/$netns ]]; then
    ip netns del "$netns" || { log "ERROR: could not delete netns $netns"; rc=1; }
  fi
  # nspawn leaves this behind when /run is not a tmpfs ("can't remove disk file system").
  [[ -d /run/systemd/nspawn/propagate/$name ]] && rm -rf --one-file-system "/run/systemd/nspawn/propagate/$name"

  # 4) the state dir last: as long as anything above failed, it still records what to retry.
  if ((rc == 0)); then
    rm -rf --one-file-system "$dir"
    rm -f "$rundir/.lock.$name"
    log "instance '$name' down in $(elapsed "$t")s"
  else
    log "instance '$name' NOT fully removed; state kept in $dir (re-run down.sh)"
  fi
  exec {lockfd}>&-
  return "$rc"
}

rundir=$DFLASH_TESTHOST_RUNDIR
targets=(); mode=list
case ${1:-} in
  --stale|--all) mode=${1#--} ;;
  ""|-h|--help) usage; exit 2 ;;
  *) for a in "$@"; do
       if [[ $a == */* ]]; then targets+=("$a"); else targets+=("$rundir/$a"); fi
     done ;;
esac
if [[ $mode != list ]]; then
  [[ -d $rundir ]] || exit 0
  # The global lock, as up.sh holds it while it allocates: a half-created state dir is never taken
  # for a stale one.
  exec {glock}>"$rundir/.lock"
  flock -w 600 "$glock" || die "could not lock $rundir/.lock"
  for d in "$rundir"/*/; do
    [[ -d $d ]] || continue
    if [[ $mode == stale ]] && owner_alive "$d"; then continue; fi
    targets+=("${d%/}")
  done
fi
status=0
for d in "${targets[@]}"; do teardown "$d" || status=1; done
exit "$status"
