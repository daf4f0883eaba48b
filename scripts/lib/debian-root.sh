# shellcheck shell=bash
# Sourced by scripts that build in, or test in, debootstrapped Debian roots
# (scripts/build-wheel, scripts/test-root). Needs root: debootstrap, chroot
# and mounts. Expects scripts/lib/debian-mirror.sh sourced beforehand.

# debian_root SUITE DIR PACKAGE...: debootstrap a minimal SUITE with PACKAGEs
# (and their dependencies) into DIR.tmp, renamed to DIR only when complete:
# an existing DIR is a finished root and is kept. Logs to DIR.log.
debian_root() {
    local suite=$1 dir=$2 mirror log=$2.log packages
    shift 2
    [[ -d $dir ]] && return
    [[ $EUID -eq 0 ]] || { echo "error: building the $suite root needs root" >&2; return 1; }
    local missing=() pkg
    for pkg in debootstrap debian-archive-keyring; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'ok installed' || missing+=("$pkg")
    done
    if ((${#missing[@]})); then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi
    mirror=$(debian_mirror)
    packages=$(IFS=,; echo "$*")
    # a debootstrap older than the suite has no script of its own for it:
    # sid's serves every later suite
    local script=/usr/share/debootstrap/scripts/$suite
    [[ -e $script ]] || script=/usr/share/debootstrap/scripts/sid
    mkdir -p "$(dirname "$dir")"
    rm -rf "$dir.tmp"
    echo "[root] debootstrapping Debian $suite into $dir (first run only, a few minutes; log: $log)"
    # Debian's keyring on the host signs bullseye to trixie: insist on checking.
    if ! unshare --mount --propagation private -- debootstrap --variant=minbase \
            --force-check-gpg --keyring=/usr/share/keyrings/debian-archive-keyring.gpg \
            --include="$packages" "$suite" "$dir.tmp" "$mirror" "$script" </dev/null >"$log" 2>&1; then
        tail -n 20 "$log" >&2
        echo "error: debootstrap $suite failed (log: $log)" >&2
        return 1
    fi
    mv -T "$dir.tmp" "$dir"
}

# in_debian_root DIR HOSTDIR CMD...: run CMD chrooted in DIR with /proc, /dev
# and HOSTDIR (bound at /work) mounted, in a private mount namespace whose
# mounts vanish with it. The network is the host's.
in_debian_root() {
    local dir=$1 work=$2
    shift 2
    mkdir -p "$dir/work"
    # shellcheck disable=SC2016  # expanded by the inner sh
    unshare --mount --propagation private -- sh -ec '
        root=$1 work=$2
        shift 2
        mount -t proc proc "$root/proc"
        mount --bind /dev "$root/dev"
        mount --bind "$work" "$root/work"
        cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
        exec chroot "$root" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 HOME=/work "$@"' \
        sh "$dir" "$work" "$@"
}
