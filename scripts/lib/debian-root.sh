# shellcheck shell=bash
# Sourced by scripts that build in, or test in, debootstrapped Debian roots
# (scripts/build-wheel, scripts/test-root). Needs root: debootstrap, chroot
# and mounts. Expects scripts/lib/debian-mirror.sh sourced beforehand.

# debian_root SUITE DIR PACKAGE...: debootstrap a minimal SUITE with PACKAGEs
# (and their dependencies) into DIR.tmp, renamed to DIR only when complete:
# an existing DIR is a finished root and is kept. Logs to DIR.log.
debian_root() {
    local suite=$1 dir=$2
    shift 2
    _debootstrap_into "$suite" "$dir" "" "$@"
}

# debian_foreign_root ARCH SUITE DIR PACKAGE...: the files of PACKAGEs (and
# their dependencies, and the suite's required ones) for another
# architecture ARCH, unpacked into DIR: a cross compiler's --sysroot, or the
# root qemu-user finds an emulated program's libraries in (-L DIR). Nothing
# is configured: debootstrap's second stage would run ARCH's programs, which
# needs binfmt. Its first stage resolves and checks the packages and
# unpacks the required ones; the rest are unpacked here. DIR as debian_root.
debian_foreign_root() {
    local arch=$1 suite=$2 dir=$3
    shift 3
    _debootstrap_into "$suite" "$dir" "$arch" "$@"
}

# _debootstrap_into SUITE DIR ARCH PACKAGE...: ARCH empty for the host's.
_debootstrap_into() {
    local suite=$1 dir=$2 arch=$3 log=$2.log mirror packages deb foreign=()
    shift 3
    [[ -d $dir ]] && return
    [[ $EUID -eq 0 ]] || { echo "error: building the $suite ${arch:+$arch }root needs root" >&2; return 1; }
    _debootstrap_installed
    mirror=$(debian_mirror)
    packages=$(IFS=,; echo "$*")
    [[ -z $arch ]] || foreign=(--foreign "--arch=$arch")
    # a debootstrap older than the suite has no script of its own for it:
    # sid's serves every later suite
    local script=/usr/share/debootstrap/scripts/$suite
    [[ -e $script ]] || script=/usr/share/debootstrap/scripts/sid
    mkdir -p "$(dirname "$dir")"
    rm -rf "$dir.tmp"
    echo "[root] debootstrapping Debian $suite ${arch:+$arch }into $dir (first run only, a few minutes; log: $log)"
    # Debian's keyring on the host signs bullseye to trixie: insist on checking.
    if ! unshare --mount --propagation private -- debootstrap "${foreign[@]}" --variant=minbase \
            --force-check-gpg --keyring=/usr/share/keyrings/debian-archive-keyring.gpg \
            --include="$packages" "$suite" "$dir.tmp" "$mirror" "$script" </dev/null >"$log" 2>&1; then
        tail -n 20 "$log" >&2
        echo "error: debootstrap $suite ${arch:+$arch }failed (log: $log)" >&2
        return 1
    fi
    if [[ -n $arch ]]; then
        for deb in "$dir.tmp"/var/cache/apt/archives/*.deb; do
            dpkg-deb -x "$deb" "$dir.tmp"
        done
    fi
    mv -T "$dir.tmp" "$dir"
}

_debootstrap_installed() {
    local missing=() pkg
    for pkg in debootstrap debian-archive-keyring; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'ok installed' || missing+=("$pkg")
    done
    if ((${#missing[@]})); then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi
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
