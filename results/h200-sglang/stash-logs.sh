#!/usr/bin/env bash
# The working tree that travels with a device call (tracked files and the carry) must stay under
# 64 MiB, and the committed call and server logs under results/ grow every session. No device
# script reads them, so they can stay behind: `stash` moves every results/*/calls and results/*/runs
# folder to $STASH (default /tmp/results-logs-stash), `restore` puts them back. Run from the
# repository root; restore before committing (git would see them as deleted).
set -euo pipefail
STASH=${STASH:-/tmp/results-logs-stash}
case "${1:-}" in
  stash)
    mkdir -p "$STASH"
    for d in results/*/calls results/*/runs; do
      [ -d "$d" ] || continue
      mkdir -p "$STASH/$(dirname "$d")"
      mv "$d" "$STASH/$d"
      echo "stashed $d"
    done ;;
  restore)
    [ -d "$STASH/results" ] || { echo "nothing stashed in $STASH"; exit 0; }
    for d in "$STASH"/results/*/calls "$STASH"/results/*/runs; do
      [ -d "$d" ] || continue
      rel=${d#"$STASH"/}
      [ -e "$rel" ] && { echo "$rel exists; leaving $d where it is" >&2; continue; }
      mv "$d" "$rel"
      echo "restored $rel"
    done ;;
  *) echo "usage: $0 stash|restore" >&2; exit 2 ;;
esac
