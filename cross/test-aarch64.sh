#!/usr/bin/env bash
# CI: the unit tests of the agent (and of the crates it is built on) built
# for aarch64 and run under qemu-user (Debian qemu-user-static, the runner
# in .cargo/config.toml), from a fresh machine:
#
#   cross/test-aarch64.sh [PACKAGE...]   (default: baton-agent baton-cron
#                                         baton-proto)
#
# Dev profile (the release profile's fat LTO takes minutes) and a target
# directory of its own ($CARGO_TARGET_DIR/aarch64, default target/aarch64),
# so the host build is not disturbed. Every agent unit test runs under
# qemu-user as on the host (SCHED_FIFO, futex, pidfd, adjtimex, mlockall
# are passed to the host kernel); the one ignored test needs a GPIO chip,
# here as on the host. Installs what is missing: the rust
# target, gcc-aarch64-linux-gnu, libc6-dev-arm64-cross, qemu-user-static.
set -euo pipefail
cd "$(dirname "$0")/.."
. cross/env.sh

target=aarch64-unknown-linux-gnu
cross_setup "$target" qemu-user-static

pkgs=("$@")
# baton-sched is left out by default: its unit tests (property tests of
# pure integer maths, as on the host) take ~50 s under qemu; pass it to run
# them too. Measured from scratch on 2 cores: ~5.5 min with it.
[ ${#pkgs[@]} -gt 0 ] || pkgs=(baton-agent baton-dispatch baton-agent-link baton-control baton-exec baton-agent-config baton-trust baton-update baton-journal baton-clock baton-gpio baton-sys baton-link-client baton-cron baton-proto)
args=()
for p in "${pkgs[@]}"; do args+=(-p "$p"); done
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}/aarch64
start=$(date +%s)
cargo test --locked --target "$target" --lib "${args[@]}"
echo "cross/test-aarch64.sh: ${pkgs[*]} built and tested in $(($(date +%s) - start)) s" >&2
