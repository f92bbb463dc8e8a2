#!/usr/bin/env bash
# Firing lateness of baton's dispatcher next to cyclictest, same machine,
# same run: lateness quantiles, and the CPU each took (baton: its spinning,
# its dispatcher thread and the whole process; cyclictest: its process,
# the floor for any thread woken 1 000 times a second on this box). Needs
# root for SCHED_FIFO (both tools fall back / refuse without).
#
#   COUNT=10000            firings (and cyclictest loops), 1 ms apart
#   SPIN=0.5%              baton's realtime.spin-budget (default: its own)
#   BASE=/path/baton-agent also run an older build first (before/after in
#                          one run; it must know bench-latency's flags)
set -euo pipefail
cd "$(dirname "$0")/.."
COUNT=${COUNT:-10000}
command -v cyclictest >/dev/null || { apt-get update -qq && apt-get install -y -qq rt-tests; }
cargo build --release -q -p baton-agent
spin_args=()
[ -n "${SPIN:-}" ] && spin_args=(--spin-budget "$SPIN")
run_baton() { # BIN OUT [extra]
  local bin=$1 out=$2; shift 2
  echo "== $bin bench-latency --count $COUNT --interval 1ms --cpu 1 $*"
  "$bin" bench-latency --count "$COUNT" --interval 1ms --cpu 1 --json "$@" | tee "$out"
}
[ -n "${BASE:-}" ] && run_baton "$BASE" /tmp/baton-lat-base.json
run_baton ./target/release/baton-agent /tmp/baton-lat.json "${spin_args[@]}"
echo "== cyclictest -m -p 80 -a 1 -i 1000 -l $COUNT"
python3 - "$COUNT" <<'PY'
import resource, subprocess, sys, time
n = sys.argv[1]
t0 = time.monotonic()
with open('/tmp/cyclic.txt', 'w') as out:
    subprocess.run(['cyclictest', '-m', '-p', '80', '-a', '1', '-i', '1000', '-l', n, '-h', '2000', '-q'], stdout=out, check=True)
wall = time.monotonic() - t0
r = resource.getrusage(resource.RUSAGE_CHILDREN)
open('/tmp/cyclic-cpu.txt', 'w').write(f"{100 * (r.ru_utime + r.ru_stime) / wall:.2f}")
PY
python3 - <<'PY'
import json, os
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
ccpu = open('/tmp/cyclic-cpu.txt').read()
def show(name, path):
    b = json.load(open(path))
    d = b.get('dispatch_cpu_pct')
    d = f"{d:.2f}%" if d is not None else "-"
    print(f"{name:10} p50 {b['p50_ns']} ns  p99 {b['p99_ns']} ns  p99.9 {b['p999_ns']} ns  max {b['max_ns']} ns  spin {b['spin_cpu_pct']:.2f}%  dispatcher {d}  process {b['process_cpu_pct']:.2f}%")
    if c99:
        print(f"{'':10} ratio p99 / cyclictest p99 = {b['p99_ns']/c99:.3f}")
if os.path.exists('/tmp/baton-lat-base.json') and os.environ.get('BASE'):
    show('baton base', '/tmp/baton-lat-base.json')
show('baton', '/tmp/baton-lat.json')
print(f"cyclictest p50 {c50} ns  p99 {c99} ns  max {mx*1000 if mx is not None else None} ns  (1 us buckets)  process {ccpu}%")
PY
