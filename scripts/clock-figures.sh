#!/usr/bin/env bash
# The link time exchange figure (docs/bench/clock.md, "The link exchange"):
# a release controller and an agent whose system clock is `untrusted` on
# loopback, so only the exchange aligns it. One host, one clock: the offset
# the agent reports (reference minus its system clock) is its error.
#   scripts/clock-figures.sh [SECONDS]   (default 30)
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-30}
cargo build --release --quiet -p baton-controller -p baton-agent
bin=target/release
dir=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
url=http://127.0.0.1:$port
cleanup() { kill "${agent:-}" "${ctl:-}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT
"$bin/baton-controller" serve --insecure --listen "127.0.0.1:$port" --data "$dir/ctl" 2>"$dir/ctl.log" &
ctl=$!
for _ in $(seq 100); do "$bin/baton-controller" agents --insecure --controller "$url" >/dev/null 2>&1 && break; sleep 0.1; done
"$bin/baton-agent" run --no-rt --quiet --id fig --data "$dir/agent" --gpio "sim:$dir/gpio" \
  --controller "$url" --insecure --system-clock untrusted 2>"$dir/agent.log" &
agent=$!
start=$(date -u +%Y-%m-%dT%H:%M:%SZ -d '+5 seconds')
sleep "$secs"
"$bin/baton-controller" clock fig --insecure --controller "$url" --since "$start" --json |
  python3 -c '
import json, statistics, sys
rows = [json.loads(l) for l in sys.stdin if l.strip()]
locked = [r for r in rows if r["source"] == "link" and r["state"] == "locked"]
if not locked:
    sys.exit("no locked link reports: %r" % rows[-3:])
off = [r["offset_ns"] / 1000 for r in locked]
unc = [r["uncertainty_ns"] / 1000 for r in locked]
print("link exchange, %d reports over %ss: |mean offset| %.1f us, sd %.1f us, max |offset| %.1f us, mean uncertainty %.1f us"
      % (len(off), sys.argv[1], abs(statistics.mean(off)), statistics.pstdev(off), max(abs(o) for o in off), statistics.mean(unc)))
' "$secs"
