# shellcheck shell=bash
# Installation half of scripts/broker (sourced by it): host packages, the
# Debian mirror, and the debootstrapped Debian roots the nodes run in.
# Uses CACHE, NODE_PATH, log, die from scripts/broker.

KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
# debootstrap 1.0.128 (bookworm) has no script for suites newer than trixie;
# every Debian suite since buster is bootstrapped by the same `sid` script.
DEBOOTSTRAP_SCRIPTS=/usr/share/debootstrap/scripts

run_logged() {  # run_logged LOGFILE CMD...: quiet unless it fails
    local logfile=$1
    shift
    if ! "$@" </dev/null >>"$logfile" 2>&1; then
        tail -n 30 "$logfile" >&2
        die "'$*' failed (full log: $logfile)"
    fi
}

# retry TRIES CMD...: a first build downloads a few hundred packages, and one
# dropped connection must not cost the whole build.
retry() {
    local tries=$1 n=1
    shift
    until "$@"; do
        ((n++ < tries)) || return 1
        log "'$1 ...' failed, trying again ($n of $tries)"
        sleep 5
    done
}

# Package scripts must not start system services: a system RabbitMQ would take
# the modern node's ports. policy-rc.d answering 101 forbids starts; we only
# add it for the duration of our install, and only if none exists.
with_no_service_starts() {
    local policy=/usr/sbin/policy-rc.d status=0
    if [[ -e $policy ]]; then
        "$@"
        return
    fi
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod 755 "$policy"
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
    "$@" || status=$?  # callers test our status, which disables set -e in here
    rm -f "$policy"
    trap - EXIT
    return "$status"
}

apt_install() {  # apt_install PKG...: install the missing ones on the host
    local missing=() pkg
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'ok installed' || missing+=("$pkg")
    done
    ((${#missing[@]})) || return 0
    log "installing ${missing[*]} with apt-get (log: $CACHE/apt.log)"
    export DEBIAN_FRONTEND=noninteractive
    run_logged "$CACHE/apt.log" apt-get update
    run_logged "$CACHE/apt.log" with_no_service_starts \
        apt-get install -y -o DPkg::Lock::Timeout=300 "${missing[@]}"
}

# debian_mirror (scripts/lib/debian-mirror.sh): the host's main Debian
# archive from apt's sources. The same archive serves every suite
# (bookworm, trixie, forky), so it is used for whichever suite a root is
# built from.
# shellcheck source=debian-mirror.sh
source "$(dirname "${BASH_SOURCE[0]}")/debian-mirror.sh"

# chroot_prefix ROOT STATE [HOSTS]: set CHROOT to a command prefix running a
# program chrooted in ROOT with /proc, /dev, /sys and a node's state folder
# STATE mounted at /pystream (each node run from a root sees its own there),
# and the file HOSTS, if given, as its /etc/hosts. The
# mounts live in a private mount namespace, so they vanish with the last
# process using them: a crashed node or an interrupted build never
# leaves /dev bound inside the cache (where an rm -rf would reach the host's
# devices), and `down` has nothing to unmount.
chroot_prefix() {
    # shellcheck disable=SC2016  # expanded by the inner sh
    CHROOT=(unshare --mount --propagation private -- sh -ec '
        root=$1 state=$2 hosts=$3
        shift 3
        mount -t proc proc "$root/proc"
        mount --bind /dev "$root/dev"
        mount --bind /sys "$root/sys"
        mount --bind "$state" "$root/pystream"
        [ -z "$hosts" ] || mount --bind "$hosts" "$root/etc/hosts"
        exec chroot "$root" "$@"' sh "$1" "$2" "${3:-}")
}

suite_root() { echo "$CACHE/$1-root"; }

# build_root SUITE: debootstrap SUITE with rabbitmq-server into a temporary
# folder, renamed into place only when complete: an existing root is a
# finished one. The Release files of bookworm, trixie and forky are all
# signed with keys in bookworm's debian-archive-keyring (12/bookworm,
# 13/trixie): debootstrap must check them.
build_root() {
    local suite=$1 root tmp mirror script logfile=$CACHE/build-$1.log
    root=$(suite_root "$suite")
    [[ -d $root ]] && return
    apt_install debootstrap debian-archive-keyring gpgv
    mirror=$(debian_mirror)
    script=$DEBOOTSTRAP_SCRIPTS/$suite
    [[ -e $script ]] || script=$DEBOOTSTRAP_SCRIPTS/sid
    tmp=$root.tmp
    mkdir -p "$CACHE/build"
    : >"$logfile"
    log "building the Debian $suite root (first run only, a few minutes; log: $logfile)"
    # A try interrupted half-way leaves a root debootstrap cannot resume:
    # each try starts afresh (its mounts died with their namespace).
    retry 3 fresh_debootstrap "$logfile" "$suite" "$tmp" "$mirror" "$script" ||
        die "debootstrap $suite failed 3 times (log: $logfile)"
    printf '#!/bin/sh\nexit 101\n' >"$tmp/usr/sbin/policy-rc.d"
    chmod 755 "$tmp/usr/sbin/policy-rc.d"
    printf '127.0.0.1 localhost\n::1 localhost\n' >"$tmp/etc/hosts"
    mkdir -p "$tmp/pystream"
    log "installing rabbitmq-server in the $suite root"
    chroot_prefix "$tmp" "$CACHE/build"
    # A testing suite's Release expires a week after it is made; a mirror
    # that lags (or a snapshot) serves an expired one. Its signature is
    # still checked: only the freshness check is relaxed, for forky.
    local apt=("${CHROOT[@]}" env -i PATH="$NODE_PATH" DEBIAN_FRONTEND=noninteractive
        apt-get -o Acquire::Retries=3)
    [[ $suite != forky ]] || apt+=(-o Acquire::Check-Valid-Until=false)
    run_logged "$logfile" "${apt[@]}" update
    run_logged "$logfile" retry 3 "${apt[@]}" install -y --no-install-recommends rabbitmq-server
    run_logged "$logfile" "${apt[@]}" clean
    mv -T "$tmp" "$root"
    # shellcheck disable=SC2016  # a dpkg-query format, not a variable
    log "$suite root ready: $(chroot "$root" dpkg-query -W -f='rabbitmq-server ${Version}' rabbitmq-server)"
}

fresh_debootstrap() {  # fresh_debootstrap LOGFILE SUITE TARGET MIRROR SCRIPT
    rm -rf "$3"
    run_in_log "$1" unshare --mount --propagation private -- \
        debootstrap --variant=minbase --force-check-gpg --keyring="$KEYRING" \
        "$2" "$3" "$4" "$5"
}

run_in_log() {  # run_in_log LOGFILE CMD...: like run_logged, but returns its status
    local logfile=$1
    shift
    "$@" </dev/null >>"$logfile" 2>&1
}
