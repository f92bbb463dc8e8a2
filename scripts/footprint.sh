#!/usr/bin/env bash
# RSS and idle CPU of `baton-agent run` holding 10 000 pending instructions
# and 10 000 undelivered feedback entries (a second pack whose one
# instruction fired N times, every millisecond, before the measurement: no
# controller takes their feedback).
#
#   SMAPS=1  also print the resident set by mapping (what is heap, code,
#            read-only data) from /proc/PID/smaps
#   MSTATS=1 also print glibc's malloc_stats() (in use against held, per
#            arena) through gdb: what the heap holds beyond what is in use
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-10000}
cargo build --release -q -p baton-agent
dir=$(mktemp -d)
trap 'kill $pid 2>/dev/null || true; rm -rf "$dir"' EXIT
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
./target/release/baton-agent run --quiet --system-clock reference ${EXTRA:-} --id fp --data "$dir/data" --gpio "sim:$dir/gpio.jsonl" --pack "$dir/pack.yaml" --pack "$dir/feedback.yaml" >/dev/null 2>"$dir/err" &
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
