#!/usr/bin/env bash
# The main job, on one machine, no root, no hardware: a controller with its
# embedded store, agents on simulated GPIO dialling it over loopback, the
# example pack pushed, then live feedback and each agent's clock offset
# until Ctrl-C, which stops the agents (safe state) and then the controller.
#
#   scripts/demo.sh [AGENTS]     (default 2: demo-01 runs blink.yaml,
#                                 demo-02 is connected with nothing targeted)
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-2}
# The demo profile: optimised, without the release build's fat LTO (see
# Cargo.toml), so a fresh clone is firing within minutes.
cargo build --profile demo --quiet -p baton-controller -p baton-agent
bin=target/demo
dir=target/demo-run/fleet
rm -rf "$dir"
mkdir -p "$dir"

pids=()
stop() {
  trap - INT TERM EXIT
  echo
  echo "stopping: agents first (each drives its pack's safe state), then the controller"
  for p in "${pids[@]:1}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]:1}"; do wait "$p" 2>/dev/null || true; done
  for v in "$dir"/*.view; do
    [ -e "$v" ] && echo "$(basename "$v" .view): $(grep '^summary' "$v" | tail -n1)"
  done
  kill -TERM "${pids[0]}" 2>/dev/null || true
  wait "${pids[0]}" 2>/dev/null || true
  echo "logs and sim GPIO writes are in $dir/"
}
trap stop INT TERM EXIT

# Own sessions: Ctrl-C reaches this script and `watch`, and stop() takes
# everything down in order.
setsid "$bin/baton-controller" serve --insecure --listen 127.0.0.1:0 \
  --http 127.0.0.1:0 --data "$dir/controller" 2>"$dir/controller.log" &
pids+=($!)
# listen.addr is written last, once the dashboard's listener is bound too.
for _ in $(seq 200); do [ -s "$dir/controller/listen.addr" ] && break; sleep 0.05; done
url="http://$(cat "$dir/controller/listen.addr")"
echo "controller on $url (store: $dir/controller/controller.db)"
echo "dashboard on http://$(cat "$dir/controller/http.addr")/ (open it in a browser)"

for i in $(seq -w 1 "$n"); do
  id="demo-$(printf %02d "$((10#$i))")"
  setsid "$bin/baton-agent" run --no-rt --quiet --insecure --controller "$url" \
    --id "$id" --label site=demo --data "$dir/$id/data" \
    --gpio "sim:$dir/$id/gpio.jsonl" >"$dir/$id.view" 2>"$dir/$id.log" &
  pids+=($!)
done

ctl() { "$bin/baton-controller" "$@" --controller "$url" --insecure; }
for _ in $(seq 200); do
  [ "$(ctl agents --json | grep -c '"connected":true')" -ge "$n" ] && break
  sleep 0.05
done
ctl push examples/packs/blink.yaml
echo
ctl agents
echo
echo "live feedback and clock reports (Ctrl-C to stop):"
ctl watch || true
