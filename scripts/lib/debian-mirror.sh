# shellcheck shell=bash
# Sourced by scripts that debootstrap Debian roots (scripts/broker,
# scripts/build-wheel): where the Debian archive is, read from this machine's
# apt sources so that no mirror is written into the repository.
#
# debian_mirror: print the URI serving the main Debian archive for the host's
# release, from apt's sources (one-line and deb822 formats);
# PYSTREAM_DEBIAN_MIRROR overrides it. Security and third-party repositories
# are skipped: the suite must be exactly the host's codename, with component
# main, signed (if at all) by Debian's keyring. Fails (status 1, a message on
# stderr) when there is none.
debian_mirror() {
    if [[ -n ${PYSTREAM_DEBIAN_MIRROR:-} ]]; then
        echo "$PYSTREAM_DEBIAN_MIRROR"
        return
    fi
    local codename uri
    codename=$(. /etc/os-release && echo "$VERSION_CODENAME")
    uri=$(_debian_one_line_sources "$codename"; _debian_deb822_sources "$codename")
    uri=${uri%%$'\n'*}
    if [[ -z $uri ]]; then
        echo "error: no Debian archive found in apt sources; set PYSTREAM_DEBIAN_MIRROR" >&2
        return 1
    fi
    echo "$uri"
}

_debian_one_line_sources() {
    local files=(/etc/apt/sources.list /etc/apt/sources.list.d/*.list)
    { cat "${files[@]}" 2>/dev/null || true; } | awk -v want="$1" '
        $1 != "deb" { next }
        {
            i = 2; opts = ""
            if ($2 ~ /^\[/) { while (i <= NF && $i !~ /\]$/) opts = opts " " $(i++); opts = opts " " $(i++) }
            uri = $i; suite = $(i + 1); main = 0
            for (j = i + 2; j <= NF && $j !~ /^#/; j++) if ($j == "main") main = 1
            if (suite == want && main && uri !~ /security/ &&
                (opts !~ /signed-by=/ || opts ~ /signed-by=[^ ]*debian-archive-keyring/)) print uri
        }'
}

_debian_deb822_sources() {
    { cat /etc/apt/sources.list.d/*.sources 2>/dev/null || true; } | awk -v want="$1" '
        function flush(   u, s, n, m, uris, suites) {
            if (f["types"] ~ /(^| )deb( |$)/ && f["enabled"] !~ /no/ &&
                f["components"] ~ /(^| )main( |$)/ && f["uris"] !~ /security/ &&
                (f["signed-by"] == "" || f["signed-by"] ~ /debian-archive-keyring/)) {
                n = split(f["uris"], uris, " "); m = split(f["suites"], suites, " ")
                for (u = 1; u <= n; u++) for (s = 1; s <= m; s++) if (suites[s] == want) print uris[u]
            }
            delete f
        }
        /^[ \t]*#/ { next }
        /^[ \t]*$/ { flush(); next }
        /^[ \t]/ { f[key] = f[key] " " $0; next }
        {
            key = tolower(substr($0, 1, index($0, ":") - 1))
            f[key] = substr($0, index($0, ":") + 1)
            gsub(/^[ \t]+|[ \t]+$/, "", f[key])
        }
        END { flush() }'
}
