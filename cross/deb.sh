#!/usr/bin/env bash
# .deb packages of the agent and the controller (cargo-deb; the contents
# are [package.metadata.deb] in agent/Cargo.toml and controller/Cargo.toml,
# maintainer scripts and default config in cross/deb/):
#
#   cross/deb.sh [TARGET...]
#
# Default targets: x86_64-unknown-linux-gnu (amd64),
# aarch64-unknown-linux-gnu (arm64), armv7-unknown-linux-gnueabihf (armhf).
# Each is built by cross/build.sh (release, fat LTO: ~9 min per target on 2
# cores), then packed; the packages land in $CARGO_TARGET_DIR/dist/deb/ and
# are checked with lintian when it is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
. cross/env.sh

targets=("$@")
[ ${#targets[@]} -gt 0 ] ||
  targets=(x86_64-unknown-linux-gnu aarch64-unknown-linux-gnu armv7-unknown-linux-gnueabihf)
if ! cargo deb --version >/dev/null 2>&1; then
  echo "deb: cargo install cargo-deb" >&2
  cargo install --locked cargo-deb --version '^3'
fi
tdir=${CARGO_TARGET_DIR:-target}
out=$tdir/dist/deb
mkdir -p "$out"
for t in "${targets[@]}"; do
  cross/build.sh "$t" baton-agent baton-controller
  cross_setup "$t"
  for p in baton-agent baton-controller; do
    # --no-build: the binaries cross/build.sh made; cargo-deb strips them
    # with the target's strip and computes $auto's libc dependency.
    cargo deb --locked --no-build --strip -p "$p" --target "$t" -o "$out/" >/dev/null
  done
done
ls -l "$out"/*.deb
if command -v lintian >/dev/null; then
  lintian --no-tag-display-limit "$out"/*.deb || true
fi
