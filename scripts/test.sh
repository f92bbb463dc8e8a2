#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs what the tests need,
# then runs the same gates as CI (format, lints, tests).
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages some tests use (util-linux for the sysfs mount-namespace
# test, iproute2 for later netns tests). Installed only if missing.
need=()
command -v unshare >/dev/null || need+=(util-linux)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && apt-get install -y -qq "${need[@]}"
  else
    echo "test.sh: missing ${need[*]} (install as root)" >&2
  fi
fi

cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
# The end-to-end tests start the real binaries; cargo only builds a
# package's binaries for its own integration tests, so build them all first.
cargo build --workspace --bins --locked
log=$(mktemp)
trap 'rm -f "$log"' EXIT
cargo test --workspace --locked 2>&1 | tee "$log"
# A short fuzzing run per target (pack parser, journal replay).
scripts/fuzz.sh 15
# One closing line for the whole suite (cargo prints one per test binary).
awk '/^test result:/ { p += $4; f += $6; i += $8 }
     END { printf "tests: %d passed, %d failed, %d skipped\n", p, f, i }' "$log"
