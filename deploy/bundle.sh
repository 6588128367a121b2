#!/bin/sh
# seqserve-bundle: makes the bundle the servers load, in the /artifacts volume (images install it on their PATH).
#   seqserve-bundle build   train, export and verify into /artifacts, unless a verified bundle built from the same
#                           arguments is already there (the compose `trainer` service, the Kubernetes trainer Job)
#   seqserve-bundle wait    block until a verified bundle is there (the Kubernetes server pods' init container)
# Environment (docs/deploy.md):
#   SEQSERVE_TRAIN_ARGS   extra `seqserve train` flags, e.g. "--data /data/corpus.tsv" (a source<TAB>target file
#                         mounted into the container) or "--preset tiny"; default: the default preset
#   SEQSERVE_EXPORT_ARGS  `seqserve export` flags; default "--int8" (add --fp16 for the gpu profile's fp16 variant)
#   SEQSERVE_ARTIFACTS    where checkpoint/ and bundle/ go; default /artifacts (the volume)
set -eu

ARTIFACTS="${SEQSERVE_ARTIFACTS:-/artifacts}"
CHECKPOINT="$ARTIFACTS/checkpoint"
BUNDLE="$ARTIFACTS/bundle"
BUILT_WITH="$ARTIFACTS/built-with"  # the arguments the verified bundle was built from
TRAIN_ARGS="${SEQSERVE_TRAIN_ARGS:-}"
EXPORT_ARGS="${SEQSERVE_EXPORT_ARGS:---int8}"
WANTED="train: $TRAIN_ARGS | export: $EXPORT_ARGS"

# The same test `make serve` relies on: verified.json names the sha256 of exactly this manifest.
verified() {
    python -c 'import sys; from seqserve.checks.verify import is_verified; sys.exit(0 if is_verified(sys.argv[1]) else 1)' \
        "$BUNDLE"
}

current() {
    verified && [ "$(cat "$BUILT_WITH" 2>/dev/null)" = "$WANTED" ]
}

build() {
    if current; then
        echo "seqserve-bundle: $BUNDLE is verified and built from the same arguments ($WANTED): nothing to do"
        return 0
    fi
    if [ "$(cat "$BUILT_WITH" 2>/dev/null || true)" != "$WANTED" ]; then
        rm -rf "$CHECKPOINT" "$BUNDLE" "$BUILT_WITH"  # other arguments: start over
    fi
    echo "seqserve-bundle: building $BUNDLE ($WANTED)"
    printf '%s\n' "$WANTED" > "$BUILT_WITH"
    resume=""
    [ -f "$CHECKPOINT/state.json" ] && resume="--resume"  # a run cut short carries on from its last step
    # shellcheck disable=SC2086  # the *_ARGS variables are lists of flags
    [ -f "$CHECKPOINT/metrics.json" ] || seqserve train --preset default --out "$CHECKPOINT" $resume $TRAIN_ARGS
    # shellcheck disable=SC2086
    seqserve export "$CHECKPOINT" --out "$BUNDLE" $EXPORT_ARGS
    seqserve verify "$BUNDLE" --checkpoint "$CHECKPOINT"  # exit 1 (and no marker) if any tolerance is broken
}

wait_for_bundle() {
    until verified; do
        echo "seqserve-bundle: waiting for a verified bundle in $BUNDLE"
        sleep 10
    done
}

case "${1:-}" in
    build) build ;;
    wait) wait_for_bundle ;;
    *) echo "usage: seqserve-bundle build|wait" >&2; exit 2 ;;
esac
