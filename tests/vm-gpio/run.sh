#!/usr/bin/env bash
# The agent's cdev and sysfs GPIO backends against a real kernel GPIO
# driver: the PL061 of qemu's aarch64 `virt` machine, driven by Debian's
# arm64 kernel, in a full-system VM (TCG, no KVM needed):
#
#   tests/vm-gpio/run.sh
#
# Builds baton-agent (and its lib unit tests) for aarch64, boots Debian's
# arm64 kernel with a busybox initramfs whose /init (tests/vm-gpio/init.sh)
# runs the agent on each backend and reads the lines back from the kernel's
# side. Prints a summary; exit 0 only if every expected check passed.
# See tests/vm-gpio/README.md for what it proves and what it does not.
#
# Installs what is missing as root: qemu-system-arm, cpio, the arm64 dpkg
# architecture (for `apt-get download` of the kernel and busybox-static;
# nothing arm64 is installed), and the cross toolchain (cross/env.sh).
# Cache: ${CARGO_TARGET_DIR:-target}/vm-gpio (the extracted kernel and
# busybox, the initramfs, the last console log).
set -euo pipefail
cd "$(dirname "$0")/../.."
. cross/env.sh

target=aarch64-unknown-linux-gnu
# The checks /init reports; a missing one (panic, hang, crash) is a failure.
expected=(
  find-pl061
  cdev-unit-hardware-round-trip
  cdev-running-levels cdev-toggle-and-pulse cdev-running-pin3-untouched
  cdev-on-held-line-refused sysfs-on-held-line-refused
  cdev-exit-0 cdev-agent-reports-safe-state cdev-safe-state-registers cdev-after-pin3-untouched
  cdev-released cdev-safe-state-gpiolib
  sysfs-running-levels sysfs-toggle-and-pulse sysfs-running-pin3-untouched
  sysfs-exit-0 sysfs-agent-reports-safe-state sysfs-safe-state-registers sysfs-after-pin3-untouched
  sysfs-safe-state-gpiolib
  sysfs-again-running-levels sysfs-again-toggle-and-pulse sysfs-again-running-pin3-untouched
  sysfs-again-exit-0 sysfs-again-agent-reports-safe-state sysfs-again-safe-state-registers
  sysfs-again-after-pin3-untouched cdev-on-sysfs-exported-line-names-sysfs
  sysfs-request-does-not-move cdev-request-does-not-move
)

start=$(date +%s)
tgt=$(realpath -m "${CARGO_TARGET_DIR:-target}")
cache=$tgt/vm-gpio
mkdir -p "$cache"

# --- Host tools. -----------------------------------------------------------
apt_updated=
apt_update() {
  [ -n "$apt_updated" ] || apt-get update -qq
  apt_updated=1
}
need_root() {
  if [ "$(id -u)" != 0 ]; then
    echo "vm-gpio: $1 (run as root to have it installed)" >&2
    exit 1
  fi
}
missing=()
command -v qemu-system-aarch64 >/dev/null || missing+=(qemu-system-arm)
command -v cpio >/dev/null || missing+=(cpio)
if [ ${#missing[@]} -gt 0 ]; then
  need_root "missing ${missing[*]}"
  echo "vm-gpio: apt-get install ${missing[*]}" >&2
  apt_update
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
cross_setup "$target"

# --- Debian's arm64 kernel and busybox, downloaded (not installed) once. ----
# `apt-get download PKG:arm64` needs the arm64 package lists, hence the
# foreign architecture; nothing arm64 is installed on the host.
arm64_lists() {
  if ! { dpkg --print-architecture; dpkg --print-foreign-architectures; } | grep -qx arm64; then
    need_root "the arm64 dpkg architecture is needed for apt-get download"
    echo "vm-gpio: dpkg --add-architecture arm64" >&2
    dpkg --add-architecture arm64
    apt_updated= # the lists fetched so far have no arm64
  fi
  if ! apt-cache show linux-image-arm64:arm64 >/dev/null 2>&1; then
    need_root "the arm64 package lists are missing"
    apt_update
  fi
}
# Unpack PKG (arm64) into DIR, unless already there.
fetch_deb() { # PKG DIR
  [ -e "$2/.done" ] && return
  arm64_lists
  rm -rf "$2" "$cache/dl"
  mkdir -p "$cache/dl" "$2"
  # apt-get download writes into the current directory, as user _apt when
  # it can: let it.
  chmod 777 "$cache/dl"
  (cd "$cache/dl" && apt-get download -qq "$1:arm64")
  dpkg-deb -x "$cache"/dl/*.deb "$2"
  rm -rf "$cache/dl"
  touch "$2/.done"
}
# The kernel is the one the linux-image-arm64 metapackage pointed to when
# the cache was filled (an older one is still a real PL061 driver, and
# re-resolving would need the network on every run).
if [ -e "$cache/kernel/.done" ]; then
  kpkg=$(cat "$cache/kernel/.pkg")
else
  arm64_lists
  kpkg=$(apt-cache depends linux-image-arm64:arm64 | sed -n 's/^ *Depends: \(linux-image-[^:]*\).*/\1/p' | head -n1)
  [ -n "$kpkg" ] || { echo "vm-gpio: cannot resolve linux-image-arm64:arm64" >&2; exit 1; }
  fetch_deb "$kpkg" "$cache/kernel"
  # Only boot/ is used (the driver is built in, checked below); the modules
  # are ~350 MB.
  rm -rf "$cache/kernel/lib" "$cache/kernel/usr"
  echo "$kpkg" >"$cache/kernel/.pkg"
fi
fetch_deb busybox-static "$cache/busybox"
vmlinuz=$(ls "$cache"/kernel/boot/vmlinuz-* | head -n1)
kconfig=$(ls "$cache"/kernel/boot/config-* | head -n1)
echo "vm-gpio: kernel $kpkg (${vmlinuz##*/})" >&2

# The kernel must have the driver and both user interfaces built in. A
# modular PL061 would need an insmod in /init, not written since Debian
# builds it in: should that change, this check says so.
for opt in CONFIG_GPIO_PL061 CONFIG_GPIO_CDEV CONFIG_GPIO_SYSFS CONFIG_DEBUG_FS CONFIG_DEVMEM CONFIG_BLK_DEV_INITRD; do
  if ! grep -qx "$opt=y" "$kconfig"; then
    echo "vm-gpio: $kpkg lacks $opt=y ($(grep "^$opt=\|# $opt " "$kconfig" || echo unset))" >&2
    exit 1
  fi
done

# --- The aarch64 binaries. ----------------------------------------------
# Dev profile, in the target directory cross/test-aarch64.sh uses, so CI
# (which runs that script just before) shares the build.
export CARGO_TARGET_DIR=$tgt/aarch64
cargo build --locked --target "$target" -p baton-agent --bin baton-agent
agent=$CARGO_TARGET_DIR/$target/debug/baton-agent
# The GPIO crate's unit tests: the ignored hardware test of the cdev
# backend runs on the PL061 too. Cargo names the executable only in its
# JSON messages.
libtests=$(cargo test --locked --target "$target" -p baton-gpio --lib --no-run --message-format=json |
  grep '"name":"baton_gpio"' | grep '"test":true' | grep -o '"executable":"[^"]*"' | cut -d'"' -f4 | head -n1 || true)
[ -x "$libtests" ] || { echo "vm-gpio: no lib test executable found" >&2; exit 1; }

# --- The initramfs. --------------------------------------------------------
root=$cache/initramfs
rm -rf "$root"
mkdir -p "$root"/{bin,lib,dev,proc,sys,tmp}
cp "$cache/busybox/bin/busybox" "$root/bin/busybox"
# Stripped: the dev profile's debug info (~100s of MB) does not fit the
# VM's memory once unpacked ("Initramfs unpacking failed: write error").
"$CROSS_STRIP" -o "$root/bin/baton-agent" "$agent"
"$CROSS_STRIP" -o "$root/bin/baton-gpio-lib-tests" "$libtests"
install -m 755 tests/vm-gpio/init.sh "$root/init"
# The binaries are dynamically linked against glibc: copy the shared
# libraries they name (and, recursively, theirs) and the loader from the
# cross libc. /init sets LD_LIBRARY_PATH=/lib.
sysroot=/usr/aarch64-linux-gnu/lib
copy_needed() { # ELF
  local lib
  for lib in $(aarch64-linux-gnu-readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
    [ -e "$root/lib/$lib" ] && continue
    [ -e "$sysroot/$lib" ] || { echo "vm-gpio: $lib (needed by ${1##*/}) not in $sysroot" >&2; exit 1; }
    cp -L "$sysroot/$lib" "$root/lib/$lib"
    copy_needed "$root/lib/$lib"
  done
}
copy_needed "$agent"
copy_needed "$libtests"
interp=$(aarch64-linux-gnu-readelf -l "$agent" | sed -n 's/.*Requesting program interpreter: \(.*\)\]/\1/p')
[ "$interp" = /lib/ld-linux-aarch64.so.1 ] || { echo "vm-gpio: unexpected interpreter $interp" >&2; exit 1; }
cp -L "$sysroot/ld-linux-aarch64.so.1" "$root/lib/"
# Packed on every run: the binaries may have been rebuilt since the last.
(cd "$root" && find . | LC_ALL=C sort | cpio --quiet -o -H newc -R 0:0) | gzip -1 >"$cache/initramfs.cpio.gz"
echo "vm-gpio: initramfs $(du -h "$cache/initramfs.cpio.gz" | cut -f1), ready in $(($(date +%s) - start)) s" >&2

# --- Boot. -----------------------------------------------------------------
# TCG (no KVM on an x86 host); cortex-a57 rather than `max`, whose pointer
# authentication is slow to emulate. No network device. iomem=relaxed keeps
# the PL061's registers readable through /dev/mem for /init's independent
# read-back. panic=-1 and -no-reboot turn a panic into qemu exiting.
log=$cache/console.log
vm_start=$(date +%s)
set +e
timeout "${VM_GPIO_TIMEOUT:-300}" qemu-system-aarch64 \
  -machine virt -cpu cortex-a57 -smp 1 -m 512 \
  -nic none -display none -monitor none -serial stdio -no-reboot \
  -kernel "$vmlinuz" -initrd "$cache/initramfs.cpio.gz" \
  -append "console=ttyAMA0 panic=-1 quiet iomem=relaxed" \
  </dev/null 2>&1 | tr -d '\r' | tee "$log"
qemu_rc=${PIPESTATUS[0]}
set -e
vm_time=$(($(date +%s) - vm_start))

# --- Verdict. --------------------------------------------------------------
echo
echo "vm-gpio: summary (qemu exit $qemu_rc, VM ${vm_time} s, total $(($(date +%s) - start)) s; console in $log)"
failed=0
npass=0
nfail=0
for name in "${expected[@]}"; do
  if grep -qx "VMTEST PASS $name" "$log"; then
    echo "  PASS $name"
    npass=$((npass + 1))
  elif line=$(grep -m1 "^VMTEST FAIL $name:" "$log"); then
    echo "  FAIL ${line#VMTEST FAIL }"
    failed=1
    nfail=$((nfail + 1))
  else
    echo "  MISSING $name"
    failed=1
    nfail=$((nfail + 1))
  fi
done
# A FAIL under a name not expected (an abort) fails too.
while read -r line; do
  name=${line#VMTEST FAIL }
  name=${name%%:*}
  printf '%s\n' "${expected[@]}" | grep -qx "$name" || { echo "  FAIL ${line#VMTEST FAIL }"; failed=1; }
done < <(grep '^VMTEST FAIL ' "$log" || true)
grep -qx 'VMTEST DONE' "$log" || { echo "  /init did not finish (timeout: exit 124; panic, hang)"; failed=1; }
if [ "$qemu_rc" != 0 ]; then
  echo "  qemu exited $qemu_rc"
  failed=1
fi
# Counted into scripts/test.sh's closing line.
echo "vm-gpio checks: $npass passed, $nfail failed"
if [ $failed = 0 ]; then
  echo "vm-gpio: all ${#expected[@]} checks passed"
else
  echo "vm-gpio: FAILED"
fi
exit $failed
