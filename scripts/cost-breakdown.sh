#!/usr/bin/env bash
# Where the agent's CPU goes per firing, at 1 000 firings/s (10 toggles
# every 10 ms, sim GPIO to /dev/null): perf samples of the whole process,
# grouped by the part of the firing path they fall in (inclusive of what
# each part calls: fdatasync under the journal, serde under feedback), times
# the process's CPU time, divided by the firings. Needs root (perf).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-10}
command -v perf >/dev/null || { apt-get update -qq && apt-get install -y -qq linux-perf; }
cargo build --release -q -p baton-agent
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
{ echo "pack: k1"; echo "version: 1"; echo "instructions:";
  for i in $(seq 0 9); do echo "  - {id: i$i, action: gpio.toggle, params: {line: $i}, every: 10ms}"; done; } > "$tmp/p.yaml"
target/release/baton-agent run --quiet --data "$tmp/d" --gpio sim:/dev/null --pack "$tmp/p.yaml" >"$tmp/out" 2>"$tmp/err" &
pid=$!
sleep 3
t0=$(awk '{print $14+$15}' /proc/$pid/stat)
perf record -q -F 2999 -g -p "$pid" -o "$tmp/perf.data" -- sleep "$secs" >/dev/null 2>&1
t1=$(awk '{print $14+$15}' /proc/$pid/stat)
kill -TERM $pid; wait $pid || true
cpu_ms=$(echo "1000 * ($t1 - $t0) / $(getconf CLK_TCK)" | bc -l)
firings=$((secs * 1000))
perf report -i "$tmp/perf.data" --children --sort symbol --stdio 2>/dev/null \
  | grep -E '^ +[0-9.]+%' > "$tmp/report"
share() { # inclusive % of the first symbol matching $1
  grep -E "$1" "$tmp/report" | head -1 | awk '{gsub("%","",$1); print $1+0}'
}
row() { # NAME PATTERN
  local p; p=$(share "$2"); p=${p:-0}
  printf "%-34s %6.1f %%   %7.2f us/firing\n" "$1" "$p" "$(echo "$cpu_ms * 1000 * $p / 100 / $firings" | bc -l)"
}
printf "process CPU over %ss: %.0f ms for %d firings (%.2f us/firing)\n" "$secs" "$cpu_ms" "$firings" "$(echo "$cpu_ms * 1000 / $firings" | bc -l)"
row "dispatcher thread (GPIO + spin)" 'dispatcher::run$|dispatcher::run '
row "core: tick (arming)" 'Scheduler::tick_ahead'
row "core: results" 'Scheduler::attempt_result'
row "journal: start records (fsync)" 'Journal::record_started'
row "journal: lazy writes + heartbeat" 'Journal::flush|Journal::heartbeat'
row "feedback (encode + outbox)" 'feedback::executed'
row "waiting/wake-ups (park, futex)" 'park_timeout'
