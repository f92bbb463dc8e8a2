#!/usr/bin/env bash
# A short fuzzing run per target (pack parser, journal replay, wire decode) with
# cargo-fuzz on the stable toolchain (RUSTC_BOOTSTRAP lets it use the
# sanitizer-coverage flags; `--sanitizer none` skips ASan, whose runtime
# needs nightly). Any crash fails the run and leaves its input in
# fuzz/artifacts/. Seconds per target: $1 (default 15).
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
secs=${1:-15}
command -v cargo-fuzz >/dev/null || cargo install --locked cargo-fuzz
export RUSTC_BOOTSTRAP=1
cargo fuzz build --sanitizer none
for t in pack_parse journal_replay wire_decode; do
  mkdir -p "corpus/$t"
  log=$(mktemp)
  if ! cargo fuzz run --sanitizer none "$t" "corpus/$t" -- \
      -max_total_time="$secs" -print_final_stats=1 >"$log" 2>&1; then
    tail -n 40 "$log"
    echo "fuzz: $t failed; the input is in fuzz/artifacts/$t/" >&2
    exit 1
  fi
  echo "fuzz: $t $(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | awk '{print $2}') runs in ${secs}s, no crash"
  rm -f "$log"
done
