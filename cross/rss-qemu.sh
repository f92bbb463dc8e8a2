#!/usr/bin/env bash
# Peak resident memory (VmHWM) of the ARM agent under qemu-user, running
# each example pack (and all of them at once) on the sim GPIO backend:
#
#   cross/rss-qemu.sh [TARGET] [SECONDS]
#
# TARGET defaults to aarch64-unknown-linux-gnu; the stripped binary comes
# from cross/build.sh ($CARGO_TARGET_DIR/dist/TARGET/baton-agent). The
# figure is the qemu process's: qemu's own code, its translation cache and
# the guest's memory together, so an upper bound of the agent on a real box.
set -euo pipefail
cd "$(dirname "$0")/.."
target=${1:-aarch64-unknown-linux-gnu}
secs=${2:-5}
bin=${CARGO_TARGET_DIR:-target}/dist/$target/baton-agent
case "$target" in
  aarch64-*-gnu) qemu=(qemu-aarch64-static -L /usr/aarch64-linux-gnu) ;;
  aarch64-*-musl) qemu=(qemu-aarch64-static) ;;
  armv7-*) qemu=(qemu-arm-static -L /usr/arm-linux-gnueabihf) ;;
  *) echo "rss-qemu: unsupported target $target" >&2; exit 2 ;;
esac
[ -x "$bin" ] || { echo "rss-qemu: no $bin (run cross/build.sh $target)" >&2; exit 1; }

measure() { # NAME PACK...
  local name=$1 work packs=() p
  shift
  work=$(mktemp -d)
  for p in "$@"; do packs+=(--pack "$p"); done
  # maintenance-exec.yaml runs logrotate: allow it (as agent.yaml would).
  printf 'exec-allowlist: [/usr/sbin/logrotate, {program: /usr/bin/true, env: [CHECK_LEVEL]}]\n' >"$work/agent.yaml"
  "${qemu[@]}" "$bin" run --no-rt --quiet --system-clock reference --config "$work/agent.yaml" \
    --gpio "sim:$work/gpio" --data "$work/d" "${packs[@]}" >"$work/out" 2>&1 &
  local pid=$! hwm=0 rss=0
  sleep "$secs"
  if [ -r /proc/$pid/status ]; then
    hwm=$(awk '/^VmHWM:/ { print $2 }' /proc/$pid/status)
    rss=$(awk '/^VmRSS:/ { print $2 }' /proc/$pid/status)
    kill -TERM "$pid" 2>/dev/null || true
  fi
  wait "$pid" 2>/dev/null || true
  if [ "$hwm" = 0 ]; then
    echo "rss-qemu: $name: the agent exited early:" >&2
    tail -5 "$work/out" >&2
  fi
  awk -v n="$name" -v h="$hwm" -v r="$rss" \
    'BEGIN { printf "%-22s VmHWM %6.1f MiB  VmRSS %6.1f MiB\n", n, h / 1024, r / 1024 }'
  rm -rf "$work"
}

echo "$target under ${qemu[0]}, ${secs} s each (qemu's own memory included):"
for p in examples/packs/*.yaml; do
  measure "$(basename "$p")" "$p"
done
measure "all examples" examples/packs/*.yaml
