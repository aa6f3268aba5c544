#!/usr/bin/env bash
# Boot one test-host instance: systemd as PID 1 under systemd-nspawn, in its own network namespace,
# reachable from this machine only, over its own veth pair and /24. Key-only root ssh.
#
# Usage: up.sh [--name NAME] [--subnet 10.X.Y] [--owner PID|none] [--checkout DIR]
#   --name      instance name (netns, machine/hostname, cgroup ci-NAME); default dfl-<random>
#   --subnet    the instance's /24 (10.X.Y.0/24); default: a free one, chosen here
#   --owner     the process whose death makes the instance "stale" (reaped by the next up.sh or
#               by `down.sh --stale`); default: the caller ($PPID, or the shell above sudo/su);
#               "none": never reaped
#   --checkout  directory bind-mounted READ-ONLY at /opt/pytest-dflash (default: this checkout)
# Prints DFLASH_TESTHOST_STATE=<state dir> on stdout when the guest is booted
# (systemctl is-system-running = running|degraded) and ssh works; logs go to stderr.
# Env: DFLASH_TESTHOST_ROOTFS, DFLASH_TESTHOST_RUNDIR, DFLASH_TESTHOST_BOOT_TIMEOUT (s, default 90)
#
# What it creates, all recorded in the state dir BEFORE being created, so that down.sh removes
# exactly these and nothing else:
#   netns NAME, veth dfh<hash> (host side; the guest side is eth0 in the netns),
#   cgroups ci-NAME/ in the unified and name=systemd hierarchies, the nspawn process tree,
#   the state dir $DFLASH_TESTHOST_RUNDIR/NAME (ssh key, ssh_config, known_hosts, console.log).
# shellcheck source-path=SCRIPTDIR
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
source "$here/lib.sh"

NAME=; SUBNET=; OWNER=$PPID; CHECKOUT=$(cd "$here/../.." && pwd)
# `sudo up.sh` from a terminal: sudo exits right after us, the shell that ran it is the owner.
while [[ $(comm_of "$OWNER") =~ ^(sudo|su|doas)$ ]]; do OWNER=$(ppid_of "$OWNER"); done
while (($#)); do
  case $1 in
    --name) NAME=$2; shift 2 ;;
    --subnet) SUBNET=$2; shift 2 ;;
    --owner) OWNER=$2; shift 2 ;;
    --checkout) CHECKOUT=$(cd "$2" && pwd); shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument: $1" ;;
  esac
done
ROOTFS=$DFLASH_TESTHOST_ROOTFS
BOOT_TIMEOUT=${DFLASH_TESTHOST_BOOT_TIMEOUT:-90}
RUNDIR=$DFLASH_TESTHOST_RUNDIR
t0=$(now)

# --- preflight (nothing created yet) -------------------------------------------------------------
need_root
cg_roots=$(cgroup_roots) || die "unsupported cgroup layout"
for c in systemd-nspawn ip ssh ssh-keygen flock setsid; do
  command -v "$c" >/dev/null || die "$c missing (run build.sh)"; done
# Shared lock on the rootfs until nspawn runs (and is recorded): build.sh takes it exclusively,
# so it never rebuilds the venv under an instance that is about to boot.
[[ -e $ROOTFS.lock ]] || die "no rootfs at $ROOTFS (run build.sh)"
exec {rlock}>>"$ROOTFS.lock"
flock -s -w 1800 "$rlock" || die "build.sh held $ROOTFS.lock for 30 min"
[[ -x $ROOTFS/lib/systemd/systemd && -f $ROOTFS/etc/dflash-testhost/config.stamp ]] ||
  die "no rootfs at $ROOTFS (run build.sh)"
[[ -f $ROOTFS$GUEST_VENV/.dflash-deps ]] || die "rootfs has no complete venv at $GUEST_VENV (run build.sh)"
[[ -d $CHECKOUT/pytest_dflash ]] || die "--checkout $CHECKOUT has no pytest_dflash/"
if [[ $OWNER == none ]]; then OWNER_START=none
else OWNER_START=$(starttime "$OWNER") || die "owner PID $OWNER is not running"; fi
if [[ -n $NAME ]]; then [[ $NAME =~ $NAME_RE ]] || die "bad --name '$NAME' (want $NAME_RE)"; fi
if [[ -n $SUBNET ]]; then
  if ! [[ $SUBNET =~ ^10\.([0-9]{1,3})\.([0-9]{1,3})$ ]] || ((BASH_REMATCH[1] > 255 || BASH_REMATCH[2] > 255))
  then die "bad --subnet '$SUBNET' (want 10.X.Y)"; fi
fi
install -d -m 700 "$RUNDIR"

# --- allocation, under the global lock --------------------------------------------------------------
# Held only while reaping stale instances and picking a name + subnet + state dir, so parallel
# ups (xdist workers) never pick the same ones yet boot in parallel.
exec {glock}>"$RUNDIR/.lock"
flock -w 600 "$glock" || die "could not lock $RUNDIR/.lock"

# 1) reap instances whose owner died (killed pytest, killed CI job); down.sh only removes what
#    their state dirs recorded.
for d in "$RUNDIR"/*/; do
  [[ -d $d ]] || continue
  owner_alive "$d" && continue
  log "reaping stale instance $(basename "$d") (owner $(state_get "$d" OWNER_PID) is gone)"
  "$here/down.sh" "$d" {glock}>&- {rlock}>&- >&2 || log "WARN: reaping $(basename "$d") failed"
done

exists() {      # anything at all carrying this name? then it is not ours to take
  [[ -e $RUNDIR/$1 ]] || [[ -e /run/netns/$1 ]] || ip link show "$(veth_of "$1")" >/dev/null 2>&1 ||
    compgen -G "/sys/fs/cgroup/*/ci-$1" >/dev/null
}
veth_of() { printf 'dfh%s' "$(printf '%s' "$1" | sha1sum | cut -c1-8)"; }   # <= 15 chars
if [[ -z $NAME ]]; then
  for _ in 1 2 3 4 5 6 7 8; do
    NAME=dfl-$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')
    exists "$NAME" || break
  done
fi
exists "$NAME" && die "'$NAME' already exists (netns, veth, cgroup or state dir): not touching it"

# 2) a free 10.X.Y.0/24: overlapping no address or route of this machine (any table) and no other
#    instance's. Only addresses of our own veth pair are ever used.
ip2int() { local IFS=.; read -r a b c d <<<"$1"; echo $(( (a << 24) | (b << 16) | (c << 8) | d )); }
taken_prefixes() {
  ip -4 -o addr show | awk '{print $4}'
  ip -4 route show table all | awk '
    $1 ~ /^(local|broadcast|unicast|multicast|blackhole|unreachable|prohibit|throw|anycast|nat)$/ {print $2; next}
    {print $1}'
  local d
  for d in "$RUNDIR"/*/; do [[ -f $d/instance.env ]] && echo "$(state_get "$d" SUBNET).0/24"; done
  return 0
}
subnet_free() {
  local ours p len m
  ours=$(ip2int "$1.0")
  while read -r p; do
    [[ $p == default || -z $p ]] && continue
    [[ $p == */* ]] || p=$p/32
    len=${p#*/}; p=${p%/*}
    [[ $p =~ ^[0-9.]+$ ]] || continue
    ((len == 0)) && continue
    m=$(( len < 24 ? len : 24 ))
    (( ($(ip2int "$p") >> (32 - m)) == (ours >> (32 - m)) )) && return 1
  done < <(taken_prefixes)
  return 0
}
if [[ -z $SUBNET ]]; then
  # 10.213.0.0/16 first, at a random offset (fewer collisions between parallel jobs), then others.
  start=$(( $(od -An -N1 -tu1 /dev/urandom) ))
  for second in 213 214 215 216; do
    for i in $(seq 0 255); do
      cand=10.$second.$(( (start + i) % 256 ))
      if subnet_free "$cand"; then SUBNET=$cand; break 2; fi
    done
  done
  [[ -n $SUBNET ]] || die "no free 10.213-216.x.0/24 subnet"
else
  subnet_free "$SUBNET" || die "subnet $SUBNET.0/24 overlaps an address or route of this machine"
fi

STATE=$RUNDIR/$NAME
VETH=$(veth_of "$NAME")
HOST_IP=$SUBNET.1 GUEST_IP=$SUBNET.2 BLACKHOLE_IP=$SUBNET.3
mkdir -m 700 "$STATE"
# Per-instance lock: held by up until the instance is booted, and by down.sh; a reaper or a second
# down waits for it instead of racing us.
exec {ilock}>"$RUNDIR/.lock.$NAME"
flock -w 5 "$ilock" || die "instance lock $RUNDIR/.lock.$NAME held by someone else"
{
  echo "NAME=$NAME"
  echo "OWNER_PID=$OWNER"
  echo "OWNER_START=$OWNER_START"
  echo "CREATED=$(date -Is)"
  echo "ROOTFS=$ROOTFS"
  echo "CHECKOUT=$CHECKOUT"
  echo "SUBNET=$SUBNET"
  echo "HOST_IP=$HOST_IP"
  echo "GUEST_IP=$GUEST_IP"
  echo "BLACKHOLE_IP=$BLACKHOLE_IP"
} >"$STATE/instance.env"
exec {glock}>&-                                # allocation done: let other ups proceed

# From here on, any failure (or Ctrl-C / TERM) tears down what was recorded so far.
cleanup_on_failure() {
  local rc=$?
  trap - ERR INT TERM
  log "up failed (rc=$rc), tearing down '$NAME'"
  exec {ilock}>&-                              # down.sh takes the instance lock itself
  "$here/down.sh" "$STATE" >&2 || true
  exit "$(( rc ? rc : 1 ))"
}
trap cleanup_on_failure ERR
trap 'false' INT TERM                          # -> ERR -> cleanup

# --- network: netns + veth pair, nothing routed beyond it ------------------------------------------
t=$(now)
state_set "$STATE" NETNS "$NAME"               # recorded before it exists: down.sh may remove it
ip netns add "$NAME"
state_set "$STATE" VETH "$VETH"
# The peer is created directly inside the netns as eth0 (no name clash with the host's eth0).
ip link add "$VETH" type veth peer name eth0 netns "$NAME"
# IPv6 off on both ends: no router solicitations / DAD chatter; the instance is IPv4-only.
sysctl -q -w "net.ipv6.conf.$VETH.disable_ipv6=1" || true
ip addr add "$HOST_IP/24" dev "$VETH"
ip link set "$VETH" up
ip netns exec "$NAME" sysctl -q -w net.ipv6.conf.eth0.disable_ipv6=1 || true
ip -n "$NAME" link set lo up
ip -n "$NAME" addr add "$GUEST_IP/24" dev eth0
ip -n "$NAME" link set eth0 up
# Deliberately NO default route in the guest: it can reach this machine's $HOST_IP and nothing else.
# BLACKHOLE_IP: a permanent neighbour entry with a MAC nobody has. Frames go down the veth and the
# guest's eth0 drops them (wrong destination MAC): a TCP connect to it times out, like a host behind
# a firewall that drops packets (an unanswered ARP would fail fast with EHOSTUNREACH instead).
ip neigh replace "$BLACKHOLE_IP" lladdr 02:df:00:00:00:fe dev "$VETH" nud permanent
log "step network: $(elapsed "$t")s ($VETH $HOST_IP <-> $NAME:eth0 $GUEST_IP)"

# --- cgroups: a private subtree for nspawn ---------------------------------------------------------
# With --register=no --keep-unit (no machined, no host systemd) nspawn creates payload/ and
# supervisor/ BELOW ITS OWN cgroup. The launcher would be at the hierarchy root, so we first make
# ci-NAME/ in the unified and name=systemd hierarchies and move ONLY the launcher process there
# (it then execs nspawn). No other process is moved; no controller or limit is changed. The v1
# controller hierarchies (memory, cpu, ...) are mounted read-only in the guest by nspawn.
cgprocs=()
while read -r r; do
  d=$r/ci-$NAME
  echo "$d" >>"$STATE/cgroups"
  mkdir "$d"
  cgprocs+=("$d/cgroup.procs")
done <<<"$cg_roots"

# --- ssh: per-instance client key, pinned host key -------------------------------------------------
ssh-keygen -q -t ed25519 -N '' -C "pytest-dflash-testhost-$NAME" -f "$STATE/id_ed25519"
install -m 600 "$STATE/id_ed25519.pub" "$STATE/authorized_keys"
# The same key for the unprivileged users (build.sh: dflash, dflash-pw). sshd reads a user's
# authorized_keys as that user: world-readable here (still root-owned, so StrictModes accepts it).
install -m 644 "$STATE/id_ed25519.pub" "$STATE/authorized_keys.users"
# The guest's /etc/hosts names the guest itself (sudo resolves its own host name, and says so on
# stderr of every command when it cannot).
printf '127.0.0.1 localhost %s\n::1 localhost\n' "$NAME" >"$STATE/hosts"
{ printf '%s ' "$GUEST_IP"; cut -d' ' -f1,2 "$ROOTFS/etc/ssh/ssh_host_ed25519_key.pub"; } >"$STATE/known_hosts"
cat >"$STATE/ssh_config" <<CONF
# pytest-dflash test host '$NAME' (state: $STATE)
Host $NAME $GUEST_IP
  HostName $GUEST_IP
  User root
  IdentityFile $STATE/id_ed25519
  IdentitiesOnly yes
  UserKnownHostsFile $STATE/known_hosts
  GlobalKnownHostsFile /dev/null
  StrictHostKeyChecking yes
  HostKeyAlgorithms ssh-ed25519
  PasswordAuthentication no
  BatchMode yes
  ConnectTimeout 3
  ServerAliveInterval 5
  ServerAliveCountMax 2
  LogLevel ERROR
CONF
state_set "$STATE" SSH_CONFIG "$STATE/ssh_config"
state_set "$STATE" IDENTITY "$STATE/id_ed25519"

# --- boot ------------------------------------------------------------------------------------------
t=$(now)
# setsid: nspawn must not get the terminal's Ctrl-C (SIGINT): down.sh stops it. The lock fds are
# closed for it: nspawn would otherwise hold them for the instance's whole life.
# shellcheck disable=SC2016  # $$ / $@ belong to the inner bash
setsid bash -c 'for f in $1; do echo $$ >"$f"; done; shift; exec "$@"' nspawn-launcher "${cgprocs[*]}" \
  systemd-nspawn --quiet --boot --directory="$ROOTFS" --machine="$NAME" \
    --register=no --keep-unit --link-journal=no --console=read-only \
    --network-namespace-path="/run/netns/$NAME" --volatile=overlay \
    --resolv-conf=off --timezone=off \
    --bind-ro="$CHECKOUT:$GUEST_CHECKOUT" \
    --bind-ro="$STATE/authorized_keys:/root/.ssh/authorized_keys" \
    --bind-ro="$STATE/authorized_keys.users:/home/dflash/.ssh/authorized_keys" \
    --bind-ro="$STATE/authorized_keys.users:/home/dflash-pw/.ssh/authorized_keys" \
    --bind-ro="$STATE/hosts:/etc/hosts" \
  </dev/null >"$STATE/console.log" 2>&1 {ilock}>&- {rlock}>&- &
NSPID=$!
state_set "$STATE" NSPAWN_PID "$NSPID"
state_set "$STATE" NSPAWN_START "$(starttime "$NSPID" || echo gone)"
exec {rlock}>&-                                # recorded: build.sh now sees the instance

ssh_ok() { timeout 5 ssh -F "$STATE/ssh_config" "$NAME" true 2>/dev/null; }
# Guest PID 1 = the child of nspawn that sits in ci-NAME/payload (nspawn briefly has another child
# during setup). Recorded as early as possible, so that down.sh can reach an orphaned guest even
# if this script is killed; re-checked once booted.
leader_now() {
  local l kids=()
  read -r -a kids <"/proc/$NSPID/task/$NSPID/children" 2>/dev/null || true
  for l in "${kids[@]}"; do
    grep -q "/ci-$NAME/payload" "/proc/$l/cgroup" 2>/dev/null && { echo "$l"; return 0; }
  done
  return 1
}
record_leader() {
  local l
  l=$(leader_now) || return 0
  [[ $l == "$(state_get "$STATE" LEADER_PID)" ]] && return 0
  state_set "$STATE" LEADER_PID "$l"
  state_set "$STATE" LEADER_START "$(starttime "$l")"
}
deadline=$(( $(date +%s) + BOOT_TIMEOUT ))
until ssh_ok; do
  record_leader
  running "$NSPID" || { log "nspawn exited during boot:"; tail -30 "$STATE/console.log" >&2; false; }
  (( $(date +%s) < deadline )) || { log "no ssh after ${BOOT_TIMEOUT}s:"; tail -30 "$STATE/console.log" >&2; false; }
  sleep 0.1
done
record_leader
log "step boot-to-ssh: $(elapsed "$t")s"
t=$(now)
left=$(( deadline - $(date +%s) )); (( left > 5 )) || left=5
sysstate=$(ssh -F "$STATE/ssh_config" "$NAME" "timeout $left systemctl is-system-running --wait" || true)
case $sysstate in
  running) ;;
  degraded) log "guest is degraded; failed units: $(ssh -F "$STATE/ssh_config" "$NAME" \
              'systemctl --failed --no-legend --plain' | awk '{print $1}' | tr '\n' ' ')" ;;
  *) log "guest did not finish booting: is-system-running=$sysstate"; tail -30 "$STATE/console.log" >&2; false ;;
esac
leader=$(state_get "$STATE" LEADER_PID)
[[ $(comm_of "$leader") == systemd ]] || { log "guest PID 1 ($leader) is not systemd"; false; }
log "step system-running: $(elapsed "$t")s ($sysstate)"

up_s=$(elapsed "$t0")
state_set "$STATE" SYSTEM_STATE "$sysstate"
state_set "$STATE" UP_SECONDS "$up_s"
trap - ERR INT TERM
log "instance '$NAME' up in ${up_s}s: guest $GUEST_IP, nspawn pid $NSPID, guest PID 1 = $leader"
log "  ssh -F $STATE/ssh_config $NAME hostname"
log "  nsenter -t $leader -m -u -i -n -p -C -- systemctl status"
log "  testinfra host spec: ssh://$NAME with ssh_config=$STATE/ssh_config"
echo "DFLASH_TESTHOST_STATE=$STATE"
