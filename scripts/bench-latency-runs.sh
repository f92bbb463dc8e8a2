#!/usr/bin/env bash
# Firing lateness against cyclictest over many runs back to back (issue 38's
# figures): each run is the agent's `bench-latency` at every spin budget in
# SPINS, then cyclictest at the same rate on the same CPU, so every ratio
# compares two measures taken a few seconds apart. Needs root (SCHED_FIFO,
# the CPU idle latency request; cyclictest holds the same request, by
# default, as the agent does).
#
#   RUNS=10 COUNT=3000 scripts/bench-latency-runs.sh      (quiet)
#   HOG=1 scripts/bench-latency-runs.sh                   (a busy loop holds
#                                     CPU 0 for the whole run: the agent's
#                                     control thread shares it; the
#                                     dispatcher and cyclictest are on CPU 1)
#   SPINS="0% 1% 2% 5%" RUNS=3 scripts/bench-latency-runs.sh
#   IDLE=off scripts/bench-latency-runs.sh   (the agent without the request;
#                                     cyclictest then runs with --laptop)
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-10} COUNT=${COUNT:-3000} SPINS=${SPINS:-1%} HOG=${HOG:-0} IDLE=${IDLE:-}
command -v cyclictest >/dev/null || { apt-get update -qq && apt-get install -y -qq rt-tests; }
cargo build --release -q -p baton-agent
out=$(mktemp -d)
hog=
if [ "$HOG" = 1 ]; then
  taskset -c 0 sh -c 'while :; do :; done' &
  hog=$!
fi
trap '[ -n "$hog" ] && kill $hog 2>/dev/null; rm -rf "$out"' EXIT
idle_args=(); laptop=()
if [ -n "$IDLE" ]; then idle_args=(--idle-latency "$IDLE"); [ "$IDLE" = off ] && laptop=(--laptop); fi
for r in $(seq 1 "$RUNS"); do
  for s in $SPINS; do
    ./target/release/baton-agent bench-latency --count "$COUNT" --interval 1ms --cpu 1 \
      --spin-budget "$s" "${idle_args[@]}" --json > "$out/agent-$r-${s%\%}.json" 2>> "$out/agent.log"
  done
  python3 - "$COUNT" "$out/cyclic-$r" "${laptop[@]}" <<'PY'
import resource, subprocess, sys, time
n, path, extra = sys.argv[1], sys.argv[2], sys.argv[3:]
t0 = time.monotonic()
with open(path + '.txt', 'w') as out:
    subprocess.run(['cyclictest', '-m', '-p', '80', '-a', '1', '-i', '1000', '-l', n, '-h', '4000', '-q', *extra],
                   stdout=out, stderr=subprocess.DEVNULL, check=True)
wall = time.monotonic() - t0
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
open(path + '.cpu', 'w').write(f"{100 * (ru.ru_utime + ru.ru_stime) / wall:.3f}")
PY
done
python3 - "$out" "$RUNS" "$SPINS" <<'PY'
import json, statistics, sys
out, runs, spins = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()
def cyclic(r):
    hist, mx = [], None
    for line in open(f"{out}/cyclic-{r}.txt"):
        if 'Max Latencies' in line:
            mx = int(line.split(':')[1].split()[0])
        p = line.split()
        if not line.startswith('#') and len(p) >= 2 and p[0].isdigit():
            hist.append((int(p[0]), int(p[1])))
    total = sum(c for _, c in hist)
    def q(f):
        acc = 0
        for us, c in hist:
            acc += c
            if acc >= f * total:
                return us
    return q(0.5), q(0.99), mx, float(open(f"{out}/cyclic-{r}.cpu").read())
def us(ns): return ns / 1000
rows, c99s = [], []
print("| run | spin | agent p50 / p99 / max (µs) | wake-up late p99 (µs) | agent CPU | cyclictest p50 / p99 / max (µs) | cyclictest CPU | p99 ratio | CPU ratio |")
print("|---|---|---|---|---|---|---|---|---|")
for r in range(1, runs + 1):
    c50, c99, cmax, ccpu = cyclic(r)
    c99s.append(c99)
    for s in spins:
        a = json.load(open(f"{out}/agent-{r}-{s.rstrip('%')}.json"))
        wake = a.get('breakdown_ns', {}).get('wake-up lateness', [None, None, None])
        w99 = f"{us(wake[1]):.1f}" if wake and wake[1] is not None else "-"
        ratio = us(a['p99_ns']) / c99 if c99 else float('inf')
        cpu_ratio = a['process_cpu_pct'] / ccpu if ccpu else float('inf')
        rows.append((s, a['p99_ns'], a['process_cpu_pct'], ratio, cpu_ratio))
        print(f"| {r} | {s} | {us(a['p50_ns']):.1f} / {us(a['p99_ns']):.1f} / {us(a['max_ns']):.0f} | {w99} | {a['process_cpu_pct']:.2f} % | {c50} / {c99} / {cmax} | {ccpu:.2f} % | {ratio:.2f} | {cpu_ratio:.2f} |")
med = statistics.median(c99s)
print(f"\ncyclictest p99 over {runs} run(s): median {med} µs, {min(c99s)}-{max(c99s)}")
for s in spins:
    mine = [x for x in rows if x[0] == s]
    p99 = [us(x[1]) for x in mine]
    print(f"spin {s}: agent p99 median {statistics.median(p99):.1f} µs ({min(p99):.1f}-{max(p99):.1f}), "
          f"{statistics.median(p99) / med:.2f}x cyclictest's median p99; "
          f"p99 <= cyclictest's in {sum(1 for x in mine if x[3] <= 1)} of {len(mine)} runs; "
          f"CPU median {statistics.median(x[2] for x in mine):.2f} %, "
          f"{statistics.median(x[4] for x in mine):.2f}x cyclictest's")
PY
