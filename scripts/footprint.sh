#!/usr/bin/env bash
# The agent's memory (release build, sim backend, memory locked), in one of
# three modes:
#
#   MODE=pending (default) RSS and idle CPU of `baton-agent run` holding
#            10 000 pending instructions and 10 000 undelivered feedback
#            entries (a second pack whose one instruction fired N times,
#            every millisecond, before the measurement: no controller takes
#            their feedback).
#   MODE=burst  N-1 one-shots due at one instant (and one hourly
#            instruction that keeps the agent running: N per pack at most):
#            RSS before the burst, once all have fired, and 1, 11 and 21 s
#            later. Target: back within 1 MB
#            of before.
#   MODE=steady 100 instructions every 10 ms (10 000 firings/s, no
#            controller): RSS every 10 s for 40 s. Target: flat, under
#            16 MB.
#
#   SMAPS=1  also print the resident set by mapping (what is heap, code,
#            read-only data) from /proc/PID/smaps
#   MSTATS=1 also print glibc's malloc_stats() (in use against held, per
#            arena) through gdb: what the heap holds beyond what is in use
#   BIN=PATH the agent binary to measure (default: a fresh release build)
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-10000}
MODE=${MODE:-pending}
if [ -z "${BIN:-}" ]; then
  cargo build --release -q -p baton-agent
  BIN=./target/release/baton-agent
fi
dir=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill $pid 2>/dev/null || true; rm -rf "$dir"' EXIT

rss_kb() { awk '/VmRSS/ {print $2}' /proc/$pid/status; }
mib() { python3 -c "print(f'{$1/1024:.1f} MiB')"; }
details() {
  if [ -n "${MSTATS:-}" ]; then
    gdb -p $pid -batch -ex "call (void)malloc_stats()" >/dev/null 2>&1 || true
    sed -n '/^Arena 0:/,$p' "$dir/err" | tail -n 20 >&2
  fi
  if [ -n "${SMAPS:-}" ]; then
    grep -E '^(Rss|Anonymous|Locked|Shared_Clean|Shared_Dirty):' /proc/$pid/smaps_rollup >&2
    awk '/^[0-9a-f]+-[0-9a-f]+ / {m = $1 " " $2 " " $6}
         /^Rss:/ && $2 > 200 {print "  " $2 " kB  " m}' /proc/$pid/smaps >&2
  fi
}

if [ "$MODE" = burst ]; then
  at=$(date -u -d '+6 seconds' +%Y-%m-%dT%H:%M:%SZ)
  {
    echo "pack: burst"; echo "version: 1"; echo "instructions:"
    echo "  - {id: keep, action: noop, every: 1h}"
    echo "  - {id: b0, action: gpio.write, params: {line: 0, value: 1}, at: &t $at}"
    for i in $(seq 1 $((N-2))); do
      echo "  - {id: b$i, action: gpio.write, params: {line: $((i % 64)), value: 1}, at: *t}"
    done
  } > "$dir/burst.yaml"
  "$BIN" run --quiet --system-clock reference ${EXTRA:-} --id fp --data "$dir/data" --gpio "sim:$dir/gpio.jsonl" --pack "$dir/burst.yaml" >/dev/null 2>"$dir/err" &
  pid=$!
  for _ in $(seq 1 600); do grep -q accepted "$dir/err" 2>/dev/null && break; sleep 0.05; done
  # Before: the pack held, nothing fired yet (and the heap trimmed after
  # parsing it, as the agent does once idle).
  sleep 3
  before=$(rss_kb)
  for _ in $(seq 1 1200); do
    [ "$(wc -l < "$dir/gpio.jsonl" 2>/dev/null || echo 0)" -ge $((N - 1)) ] && break; sleep 0.05
  done
  fired=$(wc -l < "$dir/gpio.jsonl")
  after=$(rss_kb)
  sleep 1; after1=$(rss_kb)
  sleep 10; after11=$(rss_kb)
  sleep 10; after21=$(rss_kb)
  details
  echo "burst of $((N - 1)) one-shots ($fired fired): RSS before $(mib $before), all fired $(mib $after), +1 s $(mib $after1), +11 s $(mib $after11), +21 s $(mib $after21) (target: within 1 MB of before)"
  exit 0
fi

if [ "$MODE" = steady ]; then
  {
    echo "pack: steady"; echo "version: 1"; echo "instructions:"
    for i in $(seq 0 99); do
      echo "  - {id: i$i, action: gpio.toggle, params: {line: $((i % 64))}, every: 10ms}"
    done
  } > "$dir/steady.yaml"
  "$BIN" run --quiet ${EXTRA:-} --id fp --data "$dir/data" --gpio sim:/dev/null --pack "$dir/steady.yaml" >/dev/null 2>"$dir/err" &
  pid=$!
  line="10 000 firings/s: RSS"
  for s in 10 20 30 40; do
    sleep 10
    line="$line  ${s}s $(mib $(rss_kb))"
  done
  details
  echo "$line (target: flat, under 16 MB)"
  exit 0
fi

start=$(date -u -d '+1 hour' +%Y-%m-%dT%H:%M:%SZ)
{
  echo "pack: footprint"; echo "version: 1"; echo "instructions:"
  # The first instant is anchored once and aliased, to stay under 1 MiB.
  echo "  - {id: i0, action: gpio.write, params: {line: 0, value: 1}, every: 1h, start_at: &s $start}"
  for i in $(seq 1 $((N-1))); do
    echo "  - {id: i$i, action: gpio.write, params: {line: $((i % 64)), value: 1}, every: 1h, start_at: *s}"
  done
} > "$dir/pack.yaml"
soon=$(date -u -d '+2 seconds' +%Y-%m-%dT%H:%M:%S)
until=$(date -u -d "$soon UTC + $((N / 1000)) seconds" +%Y-%m-%dT%H:%M:%S)
{
  echo "pack: feedback"; echo "version: 1"; echo "instructions:"
  echo "  - {id: f, action: noop, every: 1ms, start_at: ${soon}.000Z, until: ${until}.000Z}"
} > "$dir/feedback.yaml"
"$BIN" run --quiet --system-clock reference ${EXTRA:-} --id fp --data "$dir/data" --gpio "sim:$dir/gpio.jsonl" --pack "$dir/pack.yaml" --pack "$dir/feedback.yaml" >/dev/null 2>"$dir/err" &
pid=$!
# Wait until both packs are accepted (the agent says so on stderr), then
# until the feedback pack has fired N times.
for _ in $(seq 1 600); do [ "$(grep -c accepted "$dir/err" 2>/dev/null)" = 2 ] && break; sleep 0.05; done
sleep $((N / 1000 + 10))
if [ -n "${MSTATS:-}" ]; then
  gdb -p $pid -batch -ex "call (void)malloc_stats()" >/dev/null 2>&1
  sed -n '/^Arena 0:/,$p' "$dir/err" >&2
fi
rss_kb=$(awk '/VmRSS/ {print $2}' /proc/$pid/status)
if [ -n "${SMAPS:-}" ]; then
  grep -E '^(Rss|Anonymous|Locked):' /proc/$pid/smaps_rollup >&2
  # Resident kB per mapping of more than 200 kB: range, permissions, file.
  awk '/^[0-9a-f]+-[0-9a-f]+ / {m = $1 " " $2 " " $6}
       /^Rss:/ && $2 > 200 {print "  " $2 " kB  " m}' /proc/$pid/smaps >&2
fi
t0=$(awk '{print $14+$15}' /proc/$pid/stat); s0=$(date +%s.%N)
sleep 10
t1=$(awk '{print $14+$15}' /proc/$pid/stat); s1=$(date +%s.%N)
hz=$(getconf CLK_TCK)
python3 -c "
rss=$rss_kb/1024; cpu=100*(($t1-$t0)/$hz)/($s1-$s0)
print(f'instructions $N + feedback $N  RSS {rss:.1f} MiB ({rss*1.048576:.1f} MB)  idle CPU {cpu:.2f}% of one core')"
