#!/usr/bin/env bash
# Release binaries of the agent and the controller for an ARM edge box:
#
#   cross/build.sh TARGET [PACKAGE...]
#
# TARGET: aarch64-unknown-linux-gnu, armv7-unknown-linux-gnueabihf,
# aarch64-unknown-linux-musl (static; the agent only by default: see the
# README) or x86_64-unknown-linux-gnu. PACKAGE: baton-agent and/or
# baton-controller (default: both).
#
# Installs what is missing (the rust target, Debian's cross gcc), builds with
# the release profile (fat LTO: minutes), writes stripped copies to
# $CARGO_TARGET_DIR/dist/TARGET/ and prints their sizes. Linker and qemu
# runner: .cargo/config.toml.
set -euo pipefail
cd "$(dirname "$0")/.."
. cross/env.sh

target=${1:?usage: cross/build.sh TARGET [PACKAGE...]}
shift
pkgs=("$@")
if [ ${#pkgs[@]} -eq 0 ]; then
  case "$target" in
    *-musl) pkgs=(baton-agent) ;;
    *) pkgs=(baton-agent baton-controller) ;;
  esac
fi
cross_setup "$target"

tdir=${CARGO_TARGET_DIR:-target}
args=()
for p in "${pkgs[@]}"; do args+=(-p "$p"); done
start=$(date +%s)
cargo build --release --locked --target "$target" --bins "${args[@]}"
echo "cross: built in $(($(date +%s) - start)) s" >&2

dist=$tdir/dist/$target
mkdir -p "$dist"
for p in "${pkgs[@]}"; do
  "$CROSS_STRIP" -o "$dist/$p" "$tdir/$target/release/$p"
done
echo "stripped binaries for $target ($dist):"
for p in "${pkgs[@]}"; do
  awk -v p="$p" -v s="$(stat -c %s "$dist/$p")" -v u="$(stat -c %s "$tdir/$target/release/$p")" \
    'BEGIN { printf "  %-18s %10d bytes  %5.1f MiB   (unstripped %5.1f MiB)\n", p, s, s / 1048576, u / 1048576 }'
done
file "$dist"/* 2>/dev/null || true
