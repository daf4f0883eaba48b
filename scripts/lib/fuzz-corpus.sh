# shellcheck shell=bash
# Sourced by scripts/fuzz and scripts/fuzz-dispatch: the corpus a harness
# keeps in the repository is one archive (fuzz/*.tar.xz, a libFuzzer
# -merge=1 of earlier runs and their findings) rather than hundreds of files.
#
# corpus_unpack ARCHIVE DIR: DIR emptied, then holding ARCHIVE's inputs.
corpus_unpack() {
    rm -rf "$2"
    mkdir -p "$2"
    tar -xJf "$1" -C "$2"
}

# corpus_keep ARCHIVE FUZZER [DIR...]: with FUZZ_KEEP=1, merge DIRs (the
# unpacked archive and a run's new inputs) into a fresh folder, keeping only
# inputs that add coverage, and write that back into ARCHIVE; the archive is
# the same bytes for the same inputs (sorted names, no dates or owners).
corpus_keep() {
    [[ ${FUZZ_KEEP:-} == 1 ]] || return 0
    local archive=$1 fuzzer=$2 merged
    shift 2
    merged=$(mktemp -d)
    "$fuzzer" -merge=1 -timeout=10 -rss_limit_mb=2048 -max_len=262144 \
        "$merged" "$@" 2>&1 | tail -n 1
    tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner \
        -C "$merged" -cJf "$archive" .
    echo "[fuzz] $archive: $(find "$merged" -type f | wc -l) inputs"
    rm -rf "$merged"
}
