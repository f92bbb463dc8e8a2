#!/usr/bin/env bash
# RSS and CPU of a running agent (release build, sim GPIO logging to
# /dev/null) at idle, 1 000 and 10 000 firings/s, in one run, so the loads
# are compared with the agent's own idle figures on the same machine.
# CPU is split: the dispatcher thread (it spins before deadlines by design)
# and everything else (control loop, journal, exec workers, signals).
#
#   scripts/load-figures.sh [SECONDS]     (default 20 per load)
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-20}
cargo build --release -q -p baton-agent
bin=target/release/baton-agent
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tck=$(getconf CLK_TCK)

pack() { # NAME COUNT PERIOD
  { echo "pack: $1"; echo "version: 1"; echo "safe_state:";
    echo "  - {action: gpio.write, params: {line: 0, value: 0}}"; echo "instructions:";
    for i in $(seq 0 $(($2 - 1))); do
      echo "  - {id: i$i, action: gpio.toggle, params: {line: $i}, every: $3}"; done; } > "$tmp/$1.yaml"
}
pack idle 1 1h
pack k1 10 10ms
pack k10 100 10ms

ticks() { # PID [dispatch|rest]
  local sum=0
  for t in /proc/$1/task/*; do
    local name; name=$(cat "$t/comm")
    local v; v=$(awk '{print $14+$15}' "$t/stat")
    if [ "$2" = dispatch ] && [ "$name" = baton-dispatch ]; then sum=$((sum + v)); fi
    if [ "$2" = rest ] && [ "$name" != baton-dispatch ]; then sum=$((sum + v)); fi
  done
  echo $sum
}
rss() { awk '/VmRSS/ {print $2}' /proc/$1/status; }

printf "%-8s %10s %10s %14s %14s %10s\n" load rss_start rss_end dispatch_cpu other_cpu firings
for p in ${LOADS:-idle k1 k10}; do
  rm -rf "$tmp/data-$p"
  "$bin" run --quiet --data "$tmp/data-$p" --gpio sim:/dev/null --pack "$tmp/$p.yaml" >"$tmp/$p.out" 2>"$tmp/$p.err" &
  pid=$!
  sleep 3   # warm-up: start-up, first compaction
  r0=$(rss $pid); d0=$(ticks $pid dispatch); o0=$(ticks $pid rest)
  sleep "$secs"
  r1=$(rss $pid); d1=$(ticks $pid dispatch); o1=$(ticks $pid rest)
  kill -TERM $pid; wait $pid || true
  n=$(grep -o "summary: [0-9]*" "$tmp/$p.out" | awk '{print $2}' || true)
  printf "%-8s %8s kB %8s kB %12.2f %% %12.2f %% %10s\n" "$p" "$r0" "$r1" \
    "$(echo "100*($d1-$d0)/$tck/$secs" | bc -l)" "$(echo "100*($o1-$o0)/$tck/$secs" | bc -l)" "${n:-?}"
done
