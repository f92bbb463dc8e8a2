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
perf record -q -F 1999 -p "$pid" -o "$tmp/perf.data" -- sleep "$secs" >/dev/null 2>&1
t1=$(awk '{print $14+$15}' /proc/$pid/stat)
kill -TERM $pid; wait $pid || true
cpu_us=$(echo "1000000 * ($t1 - $t0) / $(getconf CLK_TCK)" | bc -l)
firings=$((secs * 1000))
# Self time per (thread, symbol), grouped. Release builds inline across
# crates (fat LTO), so groups are by where the time is spent, not by caller.
perf report -i "$tmp/perf.data" --no-children --sort comm,symbol --stdio 2>/dev/null \
  | grep -E '^ +[0-9.]+%' > "$tmp/report" || true
printf "process CPU over %ss: %.0f ms for %d firings: %.1f us per firing\n\n" \
  "$secs" "$(echo "$cpu_us / 1000" | bc -l)" "$firings" "$(echo "$cpu_us / $firings" | bc -l)"
awk -v cpu="$cpu_us" -v n="$firings" '
  {
    pct = $1; sub("%", "", pct); comm = $2; line = $0
    if (comm == "baton-dispatch") g = "GPIO: dispatcher thread (write + spin to the deadline)"
    else if (line ~ /fsync|blk_|bio|ext4|jbd2|writepages|iowrite|virtqueue|virtio|submit_bio|folio|filemap|sync_/) g = "journal: fdatasync (kernel)"
    else if (line ~ /baton_journal|crc32|Journal/) g = "journal: encoding, writes"
    else if (line ~ /serde|feedback|fmt::|format|Display|write_str|escape/) g = "feedback: encoding"
    else if (line ~ /baton_sched|timing|TimingWheel|skiplist|Scheduler/) g = "core: scheduler"
    else if (line ~ /malloc|free|realloc|memmove|memcpy|memcmp|_int_|unlink_chunk|consolidate/) g = "allocator, copies"
    else if (line ~ /\[k\]/) g = "kernel: wake-ups, syscalls, writes"
    else g = "control loop, other"
    share[g] += pct
  }
  END {
    for (g in share)
      printf "%5.1f %%  %6.2f us/firing  %s\n", share[g], cpu * share[g] / 100 / n, g
  }' "$tmp/report" | sort -rn
