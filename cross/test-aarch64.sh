#!/usr/bin/env bash
# CI: the unit tests of the agent (and of the crates it is built on) built
# for aarch64 and run under qemu-user (Debian qemu-user-static, the runner
# in .cargo/config.toml), from a fresh machine:
#
#   cross/test-aarch64.sh [PACKAGE...]   (default: the agent's crates,
#                                         and the update path below)
#
# Dev profile (the release profile's fat LTO takes minutes) and a target
# directory of its own ($CARGO_TARGET_DIR/aarch64, default target/aarch64),
# so the host build is not disturbed. Every agent unit test runs under
# qemu-user as on the host (SCHED_FIFO, futex, pidfd, adjtimex, mlockall
# are passed to the host kernel); the one ignored test needs a GPIO chip,
# here as on the host. Installs what is missing: the rust
# target, gcc-aarch64-linux-gnu, libc6-dev-arm64-cross, qemu-user-static.
#
# With no package named, also an agent update on aarch64: the launcher's
# tests and an update against a fake controller built for aarch64, and an
# arm64 .deb's agent updated by a controller on this host. These execute
# aarch64 images from aarch64 processes, so the script registers qemu
# with binfmt_misc (root; cross_binfmt in cross/env.sh), and installs
# cargo-deb if missing.
set -euo pipefail
cd "$(dirname "$0")/.."
. cross/env.sh

target=aarch64-unknown-linux-gnu
cross_setup "$target" qemu-user-static

named=$#
pkgs=("$@")
# baton-sched is left out by default: its unit tests (property tests of
# pure integer maths, as on the host) take ~50 s under qemu; pass it to run
# them too. Measured from scratch on 2 cores: ~5.5 min with it.
[ ${#pkgs[@]} -gt 0 ] || pkgs=(baton-agent baton-dispatch baton-agent-link baton-control baton-exec baton-agent-config baton-trust baton-update baton-journal baton-clock baton-gpio baton-sys baton-link-client baton-cron baton-proto)
args=()
for p in "${pkgs[@]}"; do args+=(-p "$p"); done
host_target_dir=${CARGO_TARGET_DIR:-$PWD/target}
export CARGO_TARGET_DIR=$host_target_dir/aarch64
start=$(date +%s)
cargo test --locked --target "$target" --lib "${args[@]}"
echo "cross/test-aarch64.sh: ${pkgs[*]} built and tested in $(($(date +%s) - start)) s" >&2
[ "$named" = 0 ] || exit 0

# The update path on an aarch64 box (issue 39), by default only. The
# kernel runs aarch64 images through qemu (binfmt_misc, root), so the
# launcher's execve of an installed aarch64 build runs too:
start=$(date +%s)
cross_binfmt
# - the box's side against a fake controller: `launch` choosing, trying
#   and rolling back builds; an update downloaded, installed and restarted
#   into, nothing twice (agent/tests/launch.rs, update_restart.rs);
cargo test --locked --target "$target" -p baton-agent --test launch --test update_restart
# - the arm64 .deb (cargo-deb, pinned: its dev-profile packaging is
#   deprecated; the dev build, stripped as the package ships it, where the
#   release profile's fat LTO would take ~9 min) unpacked as a box and
#   updated by a controller on this host, beside an x86-64 box the update
#   leaves out (tests/tests/agent_update_aarch64.rs).
command -v cargo-deb >/dev/null || cargo install --locked cargo-deb@3.8.0
rm -rf "$CARGO_TARGET_DIR/deb"
cargo deb --locked --no-build --strip --profile dev -p baton-agent --target "$target" \
  -o "$CARGO_TARGET_DIR/deb/"
deb=$(ls "$CARGO_TARGET_DIR"/deb/baton-agent_*_arm64.deb)
BATON_ARM64_DEB=$deb CARGO_TARGET_DIR=$host_target_dir \
  cargo test --locked -p baton-e2e --features qemu-aarch64 --test agent_update_aarch64
echo "cross/test-aarch64.sh: the update path under qemu (launch, update_restart, the .deb) in $(($(date +%s) - start)) s" >&2
