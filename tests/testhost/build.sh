#!/usr/bin/env bash
# Build (or reuse) the cached test-host rootfs: Debian bookworm minbase that boots systemd under
# systemd-nspawn, runs sshd (key-only root, plus two unprivileged users for `become = true`), and carries a venv at /opt/dflash-venv with the
# refserver's dependencies. Three cached layers, each with a stamp, each redone only when its
# inputs change:
#   base   debootstrap (slow, network)          stamp: $ROOTFS/etc/dflash-testhost/base.stamp
#   config sshd, masked units, .pth (cheap)      stamp: $ROOTFS/etc/dflash-testhost/config.stamp
#   venv   wheels -> /opt/dflash-venv             stamp: $ROOTFS/opt/dflash-venv/.dflash-deps
# Concurrency: the whole build runs under flock($ROOTFS.lock); a second builder waits, then finds
# everything stamped and exits in well under a second.
#
# Usage: build.sh [--force-venv] [--force]       (--force: new debootstrap)
# Env:   DFLASH_TESTHOST_ROOTFS, DFLASH_TESTHOST_CACHE, DFLASH_TESTHOST_MIRROR,
#        DFLASH_TESTHOST_VENV_PKGS (default: pyproject's refserver extra + numpy httpx),
#        DFLASH_TESTHOST_VENV_IMPORTS (smoke-test imports), DFLASH_TESTHOST_PIP (host pip command)
# shellcheck source-path=SCRIPTDIR
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
source "$here/lib.sh"

ROOTFS=$DFLASH_TESTHOST_ROOTFS
MIRROR=${DFLASH_TESTHOST_MIRROR:-http://deb.debian.org/debian}
SUITE=bookworm
# python3 (not python3-minimal: that lacks http.server); python3-venv for the guest venv; sudo for the
# non-root provisioning scenarios (`become = true`, test_remote_become.py).
APT_INCLUDE=systemd,systemd-sysv,dbus,openssh-server,iproute2,procps,python3,python3-venv,ca-certificates,sudo
# The guest venv: the refserver's runtime dependencies, read from the checkout's pyproject.toml
# (the `refserver` extra, so the venv follows it when it changes), plus numpy (a core dependency
# the refserver imports) and httpx (clients in the guest). torch is pinned there: an unpinned torch
# drags CUDA wheels in. Any change of this set rebuilds only the venv (stamp), not the rootfs.
refserver_deps() {
  # tomllib: python >= 3.11; spaces dropped so that each requirement is one word
  python3 - "$here/../../pyproject.toml" <<'PY' 2>/dev/null
import sys, tomllib
with open(sys.argv[1], "rb") as f:
    deps = tomllib.load(f)["project"]["optional-dependencies"]["refserver"]
# The grammar judge (xgrammar, through the self-reference pytest-dflash[grammar]) is left out: its triton is
# refused below (a CUDA-sized wheel) and its transformers would add minutes to every cold build; the guest's
# refservers run --grammar-backend none (units/*.service) and their profiles say structured_output = false
# (remote_helpers.write_profile).
print(" ".join(d.replace(" ", "") for d in deps if not d.startswith(("xgrammar", "pytest-dflash"))))
PY
}
VENV_PKGS=${DFLASH_TESTHOST_VENV_PKGS:-$(refserver_deps || echo "torch==2.13.0 fastapi uvicorn soundfile") numpy httpx}
# Bumped whenever configure_rootfs() changes what it writes.
CONFIG_VERSION=4

force_base=0; force_venv=0
for a in "$@"; do
  case $a in
    --force) force_base=1 ;;
    --force-venv) force_venv=1 ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument: $a" ;;
  esac
done
need_root
t_all=$(now)

# One builder at a time, from the host packages on (parallel apt-get runs would fail on apt's
# locks). The lock file sits next to the rootfs (not inside it) so it survives a rebuild; up.sh
# holds it shared while it boots.
mkdir -p "$(dirname "$ROOTFS")" "$DFLASH_TESTHOST_CACHE"
exec {lockfd}>>"$ROOTFS.lock"
t=$(now)
flock -w 1800 "$lockfd" || die "could not get $ROOTFS.lock within 30 min"
log "step lock: $(elapsed "$t")s"

# --- 1. host packages ---------------------------------------------------------------------------
t=$(now)
missing=()
command -v systemd-nspawn >/dev/null || missing+=(systemd-container)
command -v debootstrap >/dev/null || missing+=(debootstrap)
command -v ssh >/dev/null && command -v ssh-keygen >/dev/null || missing+=(openssh-client)
command -v nsenter >/dev/null || missing+=(util-linux)
command -v ip >/dev/null || missing+=(iproute2)
if ((${#missing[@]})); then
  log "installing host packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # Lock::Timeout: other apt users on the machine (colleagues, CI) must not make us fail at once.
  timeout 300 apt-get -o DPkg::Lock::Timeout=240 update -qq
  timeout 600 apt-get -o DPkg::Lock::Timeout=240 install -y -q --no-install-recommends "${missing[@]}" >/dev/null
fi
log "step host-packages: $(elapsed "$t")s"

# Refuse to change the rootfs while instances run on it (it is their overlay lower layer).
instances_using_rootfs() {
  local d
  for d in "$DFLASH_TESTHOST_RUNDIR"/*/; do
    [[ -f $d/instance.env ]] || continue
    [[ $(state_get "$d" ROOTFS) == "$ROOTFS" ]] || continue
    running "$(state_get "$d" NSPAWN_PID)" && basename "$d"
  done
  return 0
}
guard_in_use() {
  local users
  users=$(instances_using_rootfs | tr '\n' ' ')
  [[ -z $users ]] || die "rootfs $ROOTFS must change ($1) but instances run on it: $users(run down.sh first)"
}

# rm -rf that never crosses into another filesystem (a leaked /proc or bind mount).
safe_rm() { [[ -e $1 ]] && rm -rf --one-file-system -- "$1"; return 0; }

# --- 2. base: debootstrap -----------------------------------------------------------------------
base_spec="suite=$SUITE variant=minbase include=$APT_INCLUDE"
base_stamp=$ROOTFS/etc/dflash-testhost/base.stamp
if ((force_base)) || [[ ! -f $base_stamp || $(cat "$base_stamp") != "$base_spec" ]]; then
  [[ -e $ROOTFS ]] && guard_in_use "base layer"
  t=$(now)
  partial=$ROOTFS.partial
  safe_rm "$partial"                         # left by a killed build
  log "debootstrap $SUITE (minbase + ${APT_INCLUDE//,/ }) -> $partial"
  mkdir -p "$DFLASH_TESTHOST_CACHE/debs"
  # A private mount namespace: debootstrap mounts /proc and /sys in the target; with unshare those
  # mounts die with it, even if it is killed, and never show up on (or leak into) the host.
  if ! timeout 1200 unshare --mount --propagation private \
      debootstrap --variant=minbase --include="$APT_INCLUDE" \
        --cache-dir="$DFLASH_TESTHOST_CACHE/debs" \
        "$SUITE" "$partial" "$MIRROR" >"$DFLASH_TESTHOST_CACHE/debootstrap.log" 2>&1; then
    tail -25 "$DFLASH_TESTHOST_CACHE/debootstrap.log" >&2
    die "debootstrap failed (full log: $DFLASH_TESTHOST_CACHE/debootstrap.log)"
  fi
  # .debs are cached outside (--cache-dir); drop apt's lists and caches inside.
  rm -rf "$partial"/var/cache/apt/archives/*.deb "$partial"/var/cache/apt/*.bin "$partial"/var/lib/apt/lists/*
  mkdir -p "$partial/etc/dflash-testhost"
  printf '%s\n' "$base_spec" >"$partial/etc/dflash-testhost/base.stamp"
  # Swap in atomically: a killed build never leaves a half-made rootfs at $ROOTFS.
  if [[ -e $ROOTFS ]]; then mv "$ROOTFS" "$ROOTFS.old.$$"; fi
  mv "$partial" "$ROOTFS"
  safe_rm "$ROOTFS.old.$$"
  log "step debootstrap: $(elapsed "$t")s"
else
  log "step debootstrap: cached ($ROOTFS)"
fi

# --- 3. config (idempotent, cheap) --------------------------------------------------------------
configure_rootfs() {
  local r=$1 u
  # Guest hostname = nspawn machine name = instance name: no /etc/hostname in the image.
  rm -f "$r/etc/hostname"
  printf '127.0.0.1 localhost\n::1 localhost\n' >"$r/etc/hosts"
  # Key-only root ssh. authorized_keys is an empty placeholder here: up.sh bind-mounts a per-instance
  # key over it, so no long-lived root key is baked into the image.
  install -d -m 700 "$r/root/.ssh"
  install -m 600 /dev/null "$r/root/.ssh/authorized_keys"
  install -d "$r/etc/ssh/sshd_config.d"
  cat >"$r/etc/ssh/sshd_config.d/dflash-testhost.conf" <<'CONF'
# pytest-dflash test host: key-only root login, no DNS lookups, room for parallel test connections.
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM yes
UseDNS no
MaxStartups 64:30:128
MaxSessions 64
CONF
  chroot "$r" passwd -l root >/dev/null 2>&1 || true
  # Unprivileged ssh users for `become = true` (key-only, locked passwords; up.sh bind-mounts the
  # instance's public key, world-readable, over their empty authorized_keys as it does for root):
  #   dflash     sudo to root without a password (NOPASSWD), in systemd-journal (journalctl -u as itself)
  #   dflash-pw  sudo rights that ask for a password: `sudo -n` must fail at once, never hang
  for u in dflash dflash-pw; do
    chroot "$r" id -u "$u" >/dev/null 2>&1 || chroot "$r" useradd --create-home --shell /bin/sh "$u"
    chroot "$r" passwd -l "$u" >/dev/null 2>&1 || true
    install -d -m 700 -o "$(chroot "$r" id -u "$u")" -g "$(chroot "$r" id -g "$u")" "$r/home/$u/.ssh"
    install -m 644 /dev/null "$r/home/$u/.ssh/authorized_keys"
  done
  chroot "$r" usermod -a -G systemd-journal dflash
  install -d -m 750 "$r/etc/sudoers.d"
  printf 'dflash ALL=(root) NOPASSWD: ALL\n' >"$r/etc/sudoers.d/dflash"
  printf 'dflash-pw ALL=(root) ALL\n' >"$r/etc/sudoers.d/dflash-pw"
  chmod 440 "$r/etc/sudoers.d/dflash" "$r/etc/sudoers.d/dflash-pw"
  # Units that only slow the boot or fail in a network-less container.
  for u in apt-daily.timer apt-daily-upgrade.timer dpkg-db-backup.timer e2scrub_all.timer fstrim.timer \
           e2scrub_reap.service systemd-pstore.service getty@tty1.service console-getty.service \
           systemd-networkd.service systemd-networkd.socket systemd-resolved.service \
           systemd-timesyncd.service systemd-networkd-wait-online.service; do
    ln -sfn /dev/null "$r/etc/systemd/system/$u"
  done
  # Mount point of the read-only checkout (up.sh: --bind-ro=<checkout>:/opt/pytest-dflash).
  install -d "$r$GUEST_CHECKOUT"
}
config_stamp=$ROOTFS/etc/dflash-testhost/config.stamp
if [[ ! -f $config_stamp || $(cat "$config_stamp") != "$CONFIG_VERSION" ]]; then
  guard_in_use "config layer"
  t=$(now)
  configure_rootfs "$ROOTFS"
  printf '%s\n' "$CONFIG_VERSION" >"$config_stamp"
  log "step config: $(elapsed "$t")s"
else
  log "step config: cached"
fi

# --- 4. venv ------------------------------------------------------------------------------------
# The guest has no network: wheels are downloaded on the host (into a cache dir that pip reuses),
# then installed with --no-index inside the rootfs via chroot.
guest_py=$(chroot "$ROOTFS" /usr/bin/python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
venv_spec="python=$guest_py pkgs=$(tr ' ' '\n' <<<"$VENV_PKGS" | sed '/^$/d' | sort | paste -sd' ')"
venv_stamp=$ROOTFS$GUEST_VENV/.dflash-deps
if ((force_venv)) || [[ ! -f $venv_stamp || $(cat "$venv_stamp") != "$venv_spec" ]]; then
  guard_in_use "venv"
  wheels=$DFLASH_TESTHOST_CACHE/wheels-cp${guest_py/./}
  mkdir -p "$wheels"
  # Host pip: the project venv's if there is one (it carries this machine's pip config: find-links
  # with the local torch CPU wheel, local index), else python3 -m pip.
  if [[ -n ${DFLASH_TESTHOST_PIP:-} ]]; then read -r -a pip <<<"$DFLASH_TESTHOST_PIP"
  elif [[ -x $here/../../.venv/bin/pip ]]; then pip=("$here/../../.venv/bin/pip")
  else pip=(python3 -m pip); fi
  read -r -a pkgs <<<"$VENV_PKGS"
  # import names to smoke-test after the install: "torch==2.13.0" -> torch, "pyyaml" needs a
  # DFLASH_TESTHOST_VENV_IMPORTS override.
  mods=${DFLASH_TESTHOST_VENV_IMPORTS:-$(printf '%s\n' "${pkgs[@]}" | sed 's/[][<>=!~;].*//; s/-/_/g' | tr '\n' ' ')}
  read -r -a modarr <<<"$mods"; mods=${modarr[*]}   # trim and squeeze blanks
  # Wheels for the GUEST (bookworm: glibc 2.36, cpython $guest_py), whatever the host interpreter
  # is. pip does not widen manylinux_2_36 to older manylinux tags by itself: list them all.
  plats=()
  for v in $(seq 36 -1 17); do plats+=(--platform "manylinux_2_${v}_x86_64"); done
  plats+=(--platform manylinux2014_x86_64 --platform manylinux2010_x86_64 --platform manylinux1_x86_64)
  # Before downloading anything: without a local CPU torch wheel pip would fetch the CUDA build.
  if [[ " ${pkgs[*]} " == *" torch"* ]] &&
     ! compgen -G "$wheels/torch-*+cpu-*.whl" >/dev/null && ! compgen -G "/opt/wheels/torch-*+cpu-*.whl" >/dev/null
  then
    die "no torch CPU wheel in /opt/wheels or $wheels: put one there (pip would fetch the CUDA build)"
  fi
  t=$(now)
  # (grep: this machine's pip config names local index dirs that lack most packages; pip warns
  # once per package about that, which is noise.)
  timeout 1200 "${pip[@]}" download --quiet --disable-pip-version-check --dest "$wheels" \
    --only-binary=:all: "${plats[@]}" --python-version "$guest_py" --implementation cp \
    "${pkgs[@]}" pip 2> >(grep -v '^WARNING: Location .* is ignored' >&2)
  log "step venv-download: $(elapsed "$t")s ($(du -sh "$wheels" | cut -f1) of wheels in $wheels)"
  # The guest must get the CPU torch: a CUDA one (PyPI's default Linux build) is GBs of nvidia-*
  # wheels for a guest without a GPU. It comes from this machine's find-links (/opt/wheels).
  cuda=$(find "$wheels" -maxdepth 1 \( -name 'nvidia_*' -o -name 'triton-*' -o -name 'torch-*+cu*' \) -printf '%f ')
  [[ -z $cuda ]] || die "CUDA wheels were pulled for the guest venv (no local torch CPU wheel?): $cuda"

  t=$(now)
  rm -f "$venv_stamp"                          # no stamp = incomplete, even if killed below
  safe_rm "$ROOTFS$GUEST_VENV"
  install -d "$ROOTFS/tmp/dflash-wheels"
  # Runs inside the chroot. pip runs straight from its wheel: the venv itself needs no pip.
  cat >"$ROOTFS/tmp/dflash-venv-install.sh" <<SH
set -eu
/usr/bin/python3 -m venv --without-pip $GUEST_VENV
pipwhl=\$(ls /tmp/dflash-wheels/pip-*.whl | sort -V | tail -n1)
$GUEST_VENV/bin/python "\$pipwhl/pip" install --quiet --no-index --find-links /tmp/dflash-wheels \\
  --disable-pip-version-check --no-cache-dir --no-warn-script-location ${pkgs[*]}
$GUEST_VENV/bin/python -c 'import ${mods// /, }'
SH
  # A private mount namespace: the read-only wheel-cache bind mount and /proc vanish with the
  # process, even if it is killed; nothing is ever mounted on the host.
  # shellcheck disable=SC2016  # $1/$2 belong to the inner sh
  timeout 1200 unshare --mount --propagation private /bin/sh -euc '
    mount --bind -o ro "$2" "$1/tmp/dflash-wheels"
    mount -t proc proc "$1/proc"
    exec env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
      chroot "$1" /bin/sh /tmp/dflash-venv-install.sh' sh "$ROOTFS" "$wheels"
  rm -f "$ROOTFS/tmp/dflash-venv-install.sh"
  rmdir "$ROOTFS/tmp/dflash-wheels"
  # The checkout (bind-mounted read-only at boot) on the venv's sys.path, so that
  # `/opt/dflash-venv/bin/python -m pytest_dflash.refserver` runs the current checkout's code.
  printf '%s\n' "$GUEST_CHECKOUT" \
    >"$ROOTFS$GUEST_VENV/lib/python$guest_py/site-packages/pytest_dflash_checkout.pth"
  printf '%s\n' "$venv_spec" >"$venv_stamp"
  log "step venv-install: $(elapsed "$t")s ($(du -sh "$ROOTFS$GUEST_VENV" | cut -f1))"
else
  log "step venv: cached ($venv_spec)"
fi

log "built $ROOTFS ($(du -sh --one-file-system "$ROOTFS" | cut -f1)) in $(elapsed "$t_all")s"
