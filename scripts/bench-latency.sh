#!/usr/bin/env bash
# Firing lateness of baton's dispatcher next to cyclictest, same machine,
# same run. Needs root for SCHED_FIFO (both tools fall back / refuse without).
set -euo pipefail
cd "$(dirname "$0")/.."
COUNT=${COUNT:-10000}
command -v cyclictest >/dev/null || { apt-get update -qq && apt-get install -y -qq rt-tests; }
cargo build --release -q -p baton-agent
echo "== baton-agent bench-latency --count $COUNT --interval 1ms --cpu 1"
./target/release/baton-agent bench-latency --count "$COUNT" --interval 1ms --cpu 1 --json | tee /tmp/baton-lat.json
echo "== cyclictest -m -p 80 -a 1 -i 1000 -l $COUNT"
cyclictest -m -p 80 -a 1 -i 1000 -l "$COUNT" -h 2000 -q > /tmp/cyclic.txt
python3 - <<'PY'
import json
b = json.load(open('/tmp/baton-lat.json'))
hist, mx = [], None
for line in open('/tmp/cyclic.txt'):
    if line.startswith('#'):
        if 'Max Latencies' in line:
            mx = int(line.split(':')[1].split()[0])
        continue
    parts = line.split()
    if len(parts) >= 2 and parts[0].isdigit():
        hist.append((int(parts[0]), int(parts[1])))
total = sum(c for _, c in hist)
def q(p):
    acc = 0
    for us, c in hist:
        acc += c
        if acc >= p * total:
            return us * 1000
    return None
c50, c99 = q(0.5), q(0.99)
print(f"baton      p50 {b['p50_ns']} ns  p99 {b['p99_ns']} ns  p99.9 {b['p999_ns']} ns  max {b['max_ns']} ns  spin {b['spin_cpu_pct']:.2f}%  process {b['process_cpu_pct']:.2f}%")
print(f"cyclictest p50 {c50} ns  p99 {c99} ns  max {mx*1000 if mx is not None else None} ns  (1 us buckets)")
if c99:
    print(f"ratio baton p99 / cyclictest p99 = {b['p99_ns']/c99:.3f}")
PY
