#!/usr/bin/env bash
# RSS and CPU of a running agent (release build, sim GPIO logging to
# /dev/null) at idle, 1 000 instants/s (i1k: one `every: 1ms` toggle), 1 000
# and 10 000 firings/s (k1, k10: 10 and 100 toggles every 10 ms), in one
# run, so the loads are compared with the agent's own idle figures on the
# same machine (LOADS="i1k k1" picks some).
# CPU is split: the dispatcher thread (it spins before deadlines by design)
# and everything else (control loop, journal, exec workers, signals).
#
# Also what the agent writes: the journal's growth over the window
# (journal_B/f: bytes appended to journal.log per firing; no compaction
# happens in 20 s at these loads) and the process's write_bytes from
# /proc/PID/io (wb_B/f and KB/s: what reached the block layer, page
# rewrites by each fdatasync included: the flash-wear figure; on tmpfs
# write_bytes stays 0, then read the journal column). wchar is not used: it
# counts the sim GPIO log's writes to /dev/null too. dev_B/f: what the
# data directory's block device wrote per firing over the window, every
# writer included (ext4's own journal commits, which each fdatasync of a
# growing file causes and write_bytes does not count; also anything else
# running: read it on a quiet machine).
#
#   scripts/load-figures.sh [SECONDS]     (default 20 per load)
#   AGENT_ARGS="--config x.yaml" scripts/load-figures.sh   (more flags for
#                                          the agent under test, not BASE)
#   BASE=/path/to/old/baton-agent scripts/load-figures.sh 20
#                                          (each load run by both builds,
#                                          the old one first: before/after
#                                          in one run)
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
pack i1k 1 1ms
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
wbytes() { awk '/^write_bytes/ {print $2}' /proc/$1/io; }
jsize() { stat -c %s "$1/journal.log"; }
# Sectors the data directory's whole block device wrote (every process and
# the file system's own journal, which /proc/PID/io does not count): a
# quiet machine's figure includes what fdatasync makes ext4 commit.
blockdev() { local s; s=$(df --output=source "$1" | tail -1); s=${s#/dev/}; for f in /sys/class/block/"$s"/stat; do [ -r "$f" ] && echo "$f"; done; }
devbytes() { awk '{printf "%.0f\n", $7 * 512}' "$1"; }
rate() { case $1 in idle) echo 0 ;; i1k|k1) echo 1000 ;; k10) echo 10000 ;; *) echo 0 ;; esac; }

builds="new"
[ -n "${BASE:-}" ] && builds="base new"
printf "%-5s %-8s %10s %10s %14s %14s %10s %10s %10s %9s %9s %9s\n" build load rss_start rss_end dispatch_cpu other_cpu total_cpu firings journal_B/f wb_B/f wb_KB/s dev_B/f
for p in ${LOADS:-idle k1 k10}; do
 for b in $builds; do
  exe=$bin; extra=(${AGENT_ARGS:-}); [ "$b" = base ] && { exe=$BASE; extra=(); }
  d="$tmp/data-$p-$b"
  rm -rf "$d"
  "$exe" run --quiet --data "$d" --gpio sim:/dev/null --pack "$tmp/$p.yaml" "${extra[@]}" >"$tmp/$p.out" 2>"$tmp/$p.err" &
  pid=$!
  sleep 3   # warm-up: start-up, first compaction
  r0=$(rss $pid); d0=$(ticks $pid dispatch); o0=$(ticks $pid rest)
  dev=$(blockdev "$d")
  w0=$(wbytes $pid); j0=$(jsize "$d"); b0=$( [ -n "$dev" ] && devbytes "$dev" || echo 0)
  sleep "$secs"
  r1=$(rss $pid); d1=$(ticks $pid dispatch); o1=$(ticks $pid rest)
  w1=$(wbytes $pid); j1=$(jsize "$d"); b1=$( [ -n "$dev" ] && devbytes "$dev" || echo 0)
  kill -TERM $pid; wait $pid || true
  n=$(grep -o "summary: [0-9]*" "$tmp/$p.out" | awk '{print $2}' || true)
  f=$(( $(rate $p) * secs ))
  per() { if [ "$f" -gt 0 ]; then echo "scale=1; $1/$f" | bc -l; else echo -; fi; }
  printf "%-5s %-8s %8s kB %8s kB %12.2f %% %12.2f %% %8.2f %% %10s %10s %9s %9.1f %9s\n" "$b" "$p" "$r0" "$r1" \
    "$(echo "100*($d1-$d0)/$tck/$secs" | bc -l)" "$(echo "100*($o1-$o0)/$tck/$secs" | bc -l)" \
    "$(echo "100*($d1-$d0+$o1-$o0)/$tck/$secs" | bc -l)" "${n:-?}" \
    "$(per $((j1 - j0)))" "$(per $((w1 - w0)))" "$(echo "($w1-$w0)/1000/$secs" | bc -l)" "$(per $((b1 - b0)))"
 done
done
