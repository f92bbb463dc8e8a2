#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs what the tests need,
# then runs the same gates as CI (format, lints, tests).
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages some tests use (util-linux for the sysfs mount-namespace
# test, iproute2 for later netns tests, python3-venv for the Python venv
# below, chrony and linuxptp for the clock tests). Installed only if
# missing.
# As root this script can install everything below, so every
# environment-gated test must run: it fails instead of skipping
# (baton-testenv). Without root, skips are counted and named at the end.
if [ "$(id -u)" = 0 ]; then
  export BATON_REQUIRE_ALL="${BATON_REQUIRE_ALL:-1}"
fi

# Each needed tool and the Debian package that brings it.
tools=(
  "unshare util-linux"      # the sysfs mount-namespace and full-disk tests
  "ip iproute2"             # network namespaces (the PTP tests)
  "chronyd chrony"          # clock tests: chronyd as an NTP server on loopback
  "ptp4l linuxptp"          # ptp4l as a PTP grandmaster in network namespaces
  "systemd-analyze systemd" # tests/tests/systemd.rs: verify on the units
  "promtool prometheus"     # tests/tests/metrics.rs: check both expositions
)
missing_tools() {
  local t
  for t in "${tools[@]}"; do
    command -v "${t%% *}" >/dev/null || echo "${t#* }"
  done
  python3 -c 'import ensurepip' 2>/dev/null || echo "python3 python3-venv"
  # The PostgreSQL store's tests: a throwaway cluster per test binary from
  # the system's initdb / postgres (baton-testpg), never a shared server;
  # setpriv (util-linux) runs them as the package's postgres user as root.
  ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || echo postgresql
  # tests/tests/dashboard.rs: Debian's chromium through its chromedriver
  # (no browser download at run time).
  [ -x /usr/bin/chromium ] || echo chromium
  [ -x /usr/bin/chromedriver ] || echo chromium-driver
}
need=($(missing_tools))
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    # apt-get's own status is not the test: a package whose post-install
    # step fails (postgresql starting its default cluster where no init
    # system runs) leaves its files in place. What counts is whether every
    # tool is there afterwards.
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" ||
      echo "test.sh: apt-get install ${need[*]} reported a failure; checking what it left" >&2
    still=($(missing_tools))
    if [ ${#still[@]} -gt 0 ]; then
      echo "test.sh: still missing after apt-get install: ${still[*]}; stopping (the tests that need them would only fail)" >&2
      exit 1
    fi
  elif [ "${BATON_REQUIRE_ALL:-}" = 1 ]; then
    echo "test.sh: missing ${need[*]} and not root to install them; stopping (BATON_REQUIRE_ALL=1)" >&2
    exit 1
  else
    echo "test.sh: missing ${need[*]} (install as root); the tests that need them skip, and are counted" >&2
  fi
fi

# Python for the protocol interop test (tests/interop/agent.py, a client
# generated from the .proto): a venv with grpcio and grpcio-tools from PyPI
# (Debian's python3-grpc-tools is too old for proto3 `optional`). Made once;
# a failure to make it stops the run with pip's message.
pyenv=target/pyenv
if ! "$pyenv/bin/python" -c 'import grpc, grpc_tools' 2>/dev/null; then
  python3 -m venv --clear "$pyenv" &&
    "$pyenv/bin/python" -m pip install -q --disable-pip-version-check \
      'grpcio==1.*' 'grpcio-tools==1.*' || {
    echo "test.sh: could not set up $pyenv (python3, python3-venv, pip); stopping" >&2
    exit 1
  }
fi
export BATON_TEST_PYTHON="$PWD/$pyenv/bin/python"
# Set up above: the interop test fails without it here, never skips.
export BATON_REQUIRE_INTEROP=1
# Installed above: a PostgreSQL test that finds no cluster fails, never
# skips.
export BATON_REQUIRE_POSTGRES=1
# Installed above: the browser test fails without chromium, never skips.
export BATON_REQUIRE_BROWSER=1

# Incremental state roughly doubles a target directory and buys nothing in
# a from-scratch run; disk is what a CI machine may lack (a run died of
# ENOSPC in the aarch64 build). The free space is printed before each
# build stage so a full disk is obvious from the log.
export CARGO_INCREMENTAL=0
disk() { echo "test.sh: before $1: $(df -h --output=avail . | tail -n1 | tr -d ' ') free, build dirs $(du -sch target fuzz/target 2>/dev/null | tail -n1 | cut -f1)" >&2; }

disk clippy
cargo fmt --all -- --check
# No dependency that nothing uses: cargo-machete reads the manifests and
# searches the sources for each crate named in [dependencies] (it builds
# nothing; under a second). A false positive (a crate named only by code
# build.rs generates, say) goes in that crate's
# [package.metadata.cargo-machete] ignored list, with a comment saying why.
# It does not look at [dev-dependencies].
command -v cargo-machete >/dev/null || cargo install --locked cargo-machete@0.9.2
cargo machete --skip-target-dir
cargo clippy --workspace --all-targets --locked -- -D warnings
# The agent's fault hooks are compiled only with this feature (the
# end-to-end tests' build of the binaries): lint that build too.
cargo clippy -p baton-agent -p baton-gpio --all-targets --locked --features baton-agent/fault-injection -- -D warnings
# The end-to-end tests start the real binaries; cargo only builds a
# package's binaries for its own integration tests, so build them all first.
disk build
cargo build --workspace --bins --locked --features baton-agent/fault-injection
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# Tests whose environment is missing append a line here (baton-testenv):
# the closing line counts and names them; cargo counts them as passed.
# With BATON_REQUIRE_ALL=1 (CI, .ci/run) they fail instead.
export BATON_SKIP_LOG="$PWD/target/skipped.log"
mkdir -p target && : >"$BATON_SKIP_LOG"
cargo test --workspace --locked --no-fail-fast 2>&1 | tee "$log"
# The agent's unit tests built for aarch64 and run under qemu-user
# (installs the rust target, Debian's cross gcc and qemu-user-static if
# missing; its own target directory, dev profile: ~5 min from scratch).
disk aarch64
cross/test-aarch64.sh 2>&1 | tee -a "$log"
# The cdev and sysfs backends against a real kernel GPIO driver (PL061 in a
# qemu aarch64 VM with Debian's kernel; reuses the aarch64 build above,
# ~2 min). See tests/vm-gpio/README.md.
tests/vm-gpio/run.sh 2>&1 | tee -a "$log"
# A short fuzzing run per target (pack parser, journal replay, wire decode).
disk fuzz
scripts/fuzz.sh 15
disk end
# One closing line for the whole suite (cargo prints one per test binary).
# Skips are counted apart and named (cargo counts a test that returned
# early as passed); ignored tests are the hardware-only ones run by hand.
skipped=$(grep -c '^SKIP ' "$BATON_SKIP_LOG" || true)
awk -v s="$skipped" '/^test result:/ { p += $4; f += $6; i += $8 }
     /^vm-gpio checks:/ { p += $3; f += $5 }
     END { printf "tests: %d passed, %d failed, %d ignored; %d skipped for a missing environment (among the passed)\n", p, f, i, s }' "$log"
if [ "$skipped" -gt 0 ]; then
  echo "skipped:"
  sed 's/^SKIP /  /' "$BATON_SKIP_LOG"
  if [ "${BATON_REQUIRE_ALL:-}" = 1 ]; then
    echo "test.sh: skips under BATON_REQUIRE_ALL=1" >&2
    exit 1
  fi
fi
