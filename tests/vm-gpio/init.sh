#!/bin/busybox sh
# shellcheck shell=dash
# (busybox ash; dash is shellcheck's nearest dialect, `local` included.)
# /init of the test VM (busybox sh, PID 1). Runs baton-agent's cdev and
# sysfs backends against the kernel's PL061 driver and prints one
# `VMTEST PASS <name>` or `VMTEST FAIL <name>: <reason>` line per check on
# the serial console, then `VMTEST DONE` and powers off. run.sh parses them.
#
# Every verdict comes from the kernel's side of the line, never from the
# agent's own report: gpiolib's view (/sys/kernel/debug/gpio: consumer,
# direction, level) and, independently of gpiolib, the PL061's registers
# read through /dev/mem (GPIODIR, GPIODATA; the kernel is booted with
# iomem=relaxed so the driver's claimed region stays readable).
#
# Lines: offsets 0, 1, 2, 4 for the agent's pack, 5 for the cdev unit
# test, 6 and 7 for the request checks. Offset 3 is left alone: qemu's virt machine wires it to the power button
# (gpio-keys in the device tree), and a line nothing may touch doubles as a
# check that the agent moved only what it was given.

/bin/busybox mkdir -p /bin /proc /sys /dev /tmp
/bin/busybox --install -s /bin
export PATH=/bin LD_LIBRARY_PATH=/lib
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t tmpfs tmp /tmp
mount -t debugfs debugfs /sys/kernel/debug

say() { echo "VMTEST $*"; }
pass() { say "PASS $1"; }
fail() { say "FAIL $1: $2"; }
finish() {
  say DONE
  sync
  poweroff -f
  sleep 10
}
# A failure that leaves nothing sensible to test after it.
abort() {
  fail "$1" "$2"
  finish
}

# Give a slow TCG boot's deferred probes a moment: the chip must be there.
for _ in 1 2 3 4 5 6 7 8 9 10; do
  ls /sys/class/gpio/gpiochip* >/dev/null 2>&1 && break
  sleep 1
done

# --- Find the PL061: its gpiolib chip, the sysfs chip directory (named by
# --- base, not by cdev index), the cdev name, the register address.
CHIP_SYSFS=
for d in /sys/class/gpio/gpiochip*; do
  [ -e "$d/label" ] || continue
  case $(cat "$d/label") in
    *pl061*)
      CHIP_SYSFS=${d##*/}
      BASE=$(cat "$d/base")
      NGPIO=$(cat "$d/ngpio")
      LABEL=$(cat "$d/label")
      ;;
  esac
done
[ -n "$CHIP_SYSFS" ] || abort find-pl061 "no gpiochip with a pl061 label: $(cat /sys/class/gpio/gpiochip*/label 2>&1)"
# The gpio device (gpiochipN, the cdev) is a child of the same parent device.
CHIP_CDEV=$(ls -d "/sys/class/gpio/$CHIP_SYSFS/device/"gpiochip[0-9]* 2>/dev/null | head -n1)
CHIP_CDEV=${CHIP_CDEV##*/}
[ -n "$CHIP_CDEV" ] && [ -c "/dev/$CHIP_CDEV" ] || abort find-pl061 "no /dev/gpiochipN for $LABEL"
# The label is the device name, "<address>.pl061" (virt: 9030000.pl061).
ADDR=$((0x${LABEL%%.*}))
[ "$NGPIO" = 8 ] || abort find-pl061 "$LABEL has $NGPIO lines, expected 8"
echo "vm-gpio: $LABEL at $(printf 0x%x "$ADDR"): /dev/$CHIP_CDEV, sysfs $CHIP_SYSFS (base $BASE)"
pass find-pl061

# --- Kernel-side readers. -------------------------------------------------
# PL061 registers: GPIODATA is masked by address bits 9:2, so offset 0x3fc
# reads all 8 lines; GPIODIR (0x400) has 1 for outputs. Reads have no side
# effect on the device.
reg() { devmem $((ADDR + $1)) 32; }
# "DIR DATA" of line $1 from the registers: e.g. "out 1", "in 0".
hw() {
  local dir data
  dir=$(reg 0x400) && data=$(reg 0x3fc) || return 1
  if [ $(($dir >> $1 & 1)) = 1 ]; then echo "out $(($data >> $1 & 1))"; else echo "in $(($data >> $1 & 1))"; fi
}
# gpiolib's view of line $1 (requested lines only): "consumer dir hi|lo",
# e.g. "baton-agent out hi"; empty when the line is not requested. The
# debugfs line reads " gpio-504 (                    |baton-agent         ) out hi".
# Parsed in the shell: no fork+exec, so that the bracketing register reads
# in `level` stay close together.
dbg() {
  local n=$((BASE + $1)) line c r
  while IFS= read -r line; do
    case $line in
      " gpio-$n "*)
        c=${line#*|}
        c=${c%%)*}
        c=${c%"${c##*[! ]}"}
        r=${line##*) }
        # shellcheck disable=SC2086 # split "out hi [flags]" into words
        set -- $r
        echo "$c $1 $2"
        ;;
    esac
  done </sys/kernel/debug/gpio
}
# Both views, and that they agree: prints "out 1" etc. Status 1 if gpiolib
# shows the line requested by someone other than $2 (when $2 is given) or
# disagrees with the registers. A toggling line can move between the two
# reads: GPIODATA is read before and after gpiolib, and only a try where it
# did not move counts; status 2 (inconclusive) after 10 tries that all saw
# a move.
level() {
  local h h2 d want_consumer=${2-}
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    h=$(hw "$1") || {
      echo "devmem failed"
      return 1
    }
    [ -n "$want_consumer" ] || {
      echo "$h"
      return 0
    }
    d=$(dbg "$1")
    h2=$(($(reg 0x3fc) >> $1 & 1))
    [ "${h#* }" = "$h2" ] || continue
    case $d in
      "$want_consumer out hi") [ "$h" = "out 1" ] || { echo "gpiolib '$d', registers '$h'"; return 1; } ;;
      "$want_consumer out lo") [ "$h" = "out 0" ] || { echo "gpiolib '$d', registers '$h'"; return 1; } ;;
      *) echo "gpiolib shows '$d' (registers '$h'), expected held by $want_consumer as output"; return 1 ;;
    esac
    echo "$h"
    return 0
  done
  echo "line kept moving between reads"
  return 2
}

# Offset 3 (power button) must stay an input through everything.
check_pin3() {
  [ "$(hw 3)" = "in 1" ] || [ "$(hw 3)" = "in 0" ] || { fail "$1-pin3-untouched" "offset 3 is '$(hw 3)'"; return; }
  pass "$1-pin3-untouched"
}

echo "vm-gpio: initial registers DIR=$(reg 0x400) DATA=$(reg 0x3fc)"

# --- 1. The cdev backend's own hardware unit test (ignored by default). ---
# Offset 5: its own line, so the agent scenarios start from untouched pins.
if [ -x /bin/baton-gpio-lib-tests ]; then
  out=$(BATON_TEST_GPIO_LINE="$CHIP_CDEV:5" /bin/baton-gpio-lib-tests \
    --ignored --exact cdev::tests::hardware_round_trip --test-threads 1 2>&1)
  rc=$?
  echo "$out" | sed 's/^/  unit: /'
  # The test returns Ok and prints SKIP without the variable: insist on a
  # real run, and that its last write (0) is what the register holds after
  # the request was released.
  if [ $rc != 0 ]; then
    fail cdev-unit-hardware-round-trip "exit $rc"
  elif echo "$out" | grep -q SKIP || ! echo "$out" | grep -q 'test result: ok. 1 passed'; then
    fail cdev-unit-hardware-round-trip "did not run exactly one test"
  elif [ "$(hw 5)" != "out 0" ]; then
    fail cdev-unit-hardware-round-trip "offset 5 after the test: '$(hw 5)', expected 'out 0' (its last write)"
  else
    pass cdev-unit-hardware-round-trip
  fi
else
  fail cdev-unit-hardware-round-trip "/bin/baton-gpio-lib-tests missing from the initramfs"
fi

# --- 2. The agent, once per backend. --------------------------------------
# The pack: offset 0 set high at acceptance, offset 1 set low just after,
# offset 2 toggling, offset 4 pulsing. The safe state is a mix (0 low,
# 1 HIGH, 2 low, 4 low) and differs from the running levels of 0 and 1, so
# neither a stuck line nor a released-and-floating one can pass by chance.
write_pack() { # $1: chip name as the backend knows it, $2: file
  # (An action's line is `line:` plus `chip:`; `line: "chip:0"` would be a
  # line *name*. The allowlist, below, does take `chip:offset`.)
  cat >"$2" <<EOF
pack: vm-gpio
version: 1
defaults:
  max_lateness: 2s   # TCG is slow; a skipped firing is not what is tested
safe_state:
  - {action: gpio.write, params: {chip: "$1", line: 0, value: 0}}
  - {action: gpio.write, params: {chip: "$1", line: 1, value: 1}}
  - {action: gpio.write, params: {chip: "$1", line: 2, value: 0}}
  - {action: gpio.write, params: {chip: "$1", line: 4, value: 0}}
instructions:
  - {id: a-high, action: gpio.write, params: {chip: "$1", line: 0, value: 1}, every: 1h}
  - {id: b-low, action: gpio.write, params: {chip: "$1", line: 1, value: 0}, after: [a-high], delay: 100ms}
  - {id: blink, action: gpio.toggle, params: {chip: "$1", line: 2}, every: 700ms}
  - {id: press, action: gpio.pulse, params: {chip: "$1", line: 4, width: 400ms}, every: 1s}
EOF
}

busy_refused() { # $1: backend of the second agent, $2: its chip name, $3: the first agent's pid
  local name=$1-on-held-line-refused d=/tmp/second-$1 rc before after
  mkdir -p "$d"
  write_pack "$2" "$d/pack.yaml"
  before="$(level 0 baton-agent)/$(level 1 baton-agent)"
  # (busybox timeout exits with the command's status: a hang shows as 0,
  # the agent's exit after SIGTERM.)
  timeout 60 baton-agent run --no-rt --system-clock reference --gpio "$1" \
    --data "$d/data" --pack "$d/pack.yaml" --exit-when-idle >"$d/stdout" 2>"$d/stderr"
  rc=$?
  after="$(level 0 baton-agent)/$(level 1 baton-agent)"
  echo "vm-gpio: second agent ($1): exit $rc; $(grep -i 'busy\|refused\|error' "$d/stderr" | head -n 3)"
  if [ $rc = 0 ]; then
    fail "$name" "the second agent exited 0 (expected a refusal)"
  elif ! grep -qi 'busy' "$d/stderr"; then
    fail "$name" "no 'busy' in the second agent's errors: $(tail -n 3 "$d/stderr")"
  elif [ "$before" != "out 1/out 0" ] || [ "$after" != "$before" ] || ! kill -0 "$3" 2>/dev/null; then
    fail "$name" "offsets 0/1 were '$before', then '$after'; first agent alive: $(kill -0 "$3" 2>/dev/null && echo yes || echo no)"
  else
    pass "$name"
  fi
}

scenario() { # $1: check name prefix, $2: backend (cdev | sysfs), $3: chip name for the pack
  local b=$1 backend=$2 chip=$3 d=/tmp/agent-$1 consumer pid i s rc hi2 lo2 hi4 lo4 ok before after skipped
  mkdir -p "$d"
  write_pack "$chip" "$d/pack.yaml"
  # The allowlist names exactly the four lines, on the real chip.
  cat >"$d/agent.yaml" <<EOF
id: vm-$b
allowed-lines: ["$chip:0", "$chip:1", "$chip:2", "$chip:4"]
EOF
  # cdev lines carry the agent's consumer label; sysfs-exported lines are
  # labelled "sysfs" by the kernel.
  if [ "$backend" = cdev ]; then consumer=baton-agent; else consumer=sysfs; fi

  baton-agent run --config "$d/agent.yaml" --no-rt --system-clock reference \
    --gpio "$backend" --data "$d/data" --pack "$d/pack.yaml" >"$d/stdout" 2>"$d/stderr" &
  pid=$!

  # Running: wait for 0 high and 1 low as the kernel sees them.
  ok=
  for i in $(seq 1 120); do
    if [ "$(level 0 $consumer 2>/dev/null)" = "out 1" ] && [ "$(level 1 $consumer 2>/dev/null)" = "out 0" ]; then
      ok=1
      break
    fi
    kill -0 $pid 2>/dev/null || break
    usleep 250000
  done
  if [ -n "$ok" ]; then
    pass "$b-running-levels"
  else
    fail "$b-running-levels" "offset 0: '$(level 0 $consumer)', offset 1: '$(level 1 $consumer)' (want out 1 / out 0 held by $consumer); agent alive: $(kill -0 $pid 2>/dev/null && echo yes || echo no)"
  fi

  # The toggle and the pulse move: sample both views (each sample also
  # checks that gpiolib and the registers agree) at least 12 times, and on
  # until both lines were seen high and low, at most 100 times (a sample
  # forks several processes: 0.1-0.5 s under TCG, with the host's load).
  # The sleep varies so that the sampling cannot lock onto the toggle's
  # period and see one level only. An inconclusive sample (the line moved
  # during every try) is not counted.
  hi2=0 lo2=0 hi4=0 lo4=0 ok=1 skipped=0
  for i in $(seq 1 100); do
    s=$(level 2 $consumer)
    case $?/$s in
      0/"out 1") hi2=$((hi2 + 1)) ;;
      0/"out 0") lo2=$((lo2 + 1)) ;;
      2/*) skipped=$((skipped + 1)) ;;
      *) ok="offset 2: $s"; break ;;
    esac
    s=$(level 4 $consumer)
    case $?/$s in
      0/"out 1") hi4=$((hi4 + 1)) ;;
      0/"out 0") lo4=$((lo4 + 1)) ;;
      2/*) skipped=$((skipped + 1)) ;;
      *) ok="offset 4: $s"; break ;;
    esac
    [ $i -ge 12 ] && [ $hi2 != 0 ] && [ $lo2 != 0 ] && [ $hi4 != 0 ] && [ $lo4 != 0 ] && break
    usleep $((20000 + i * 37000 % 130000))
  done
  echo "vm-gpio: $b samples: offset 2 hi=$hi2 lo=$lo2, offset 4 hi=$hi4 lo=$lo4, inconclusive $skipped"
  if [ "$ok" != 1 ]; then
    fail "$b-toggle-and-pulse" "$ok"
  elif [ $hi2 = 0 ] || [ $lo2 = 0 ] || [ $hi4 = 0 ] || [ $lo4 = 0 ]; then
    fail "$b-toggle-and-pulse" "a line never moved (offset 2 hi=$hi2 lo=$lo2, offset 4 hi=$hi4 lo=$lo4)"
  else
    pass "$b-toggle-and-pulse"
  fi
  check_pin3 "$b-running"

  # cdev only: a second agent wanting the same lines, on either backend,
  # gets EBUSY from the kernel (cdev: the line request; sysfs: the export,
  # with no gpioN directory, unlike a line we exported ourselves), refuses
  # the pack, and moves nothing of the first one's.
  if [ "$b" = cdev ]; then
    busy_refused cdev "$chip" $pid
    busy_refused sysfs "$CHIP_SYSFS" $pid
  fi

  # Stop: SIGTERM, the agent drives the safe state and exits 0.
  kill -TERM $pid
  wait $pid
  rc=$?
  echo "--- agent ($b) stdout (last 15 lines) ---"
  tail -n 15 "$d/stdout"
  echo "--- agent ($b) stderr (last 15 lines) ---"
  tail -n 15 "$d/stderr"
  echo "---"
  if [ $rc = 0 ]; then pass "$b-exit-0"; else fail "$b-exit-0" "exit status $rc"; fi
  # The agent's own account (secondary to the kernel's, checked next): a
  # safe_state feedback line for the pack, and the flushed journal.
  if grep -q '^default/vm-gpio  *safe_state  *safe state (shutdown)' "$d/stdout" &&
    grep -q 'safe state entered, journal flushed' "$d/stderr"; then
    pass "$b-agent-reports-safe-state"
  else
    fail "$b-agent-reports-safe-state" "no safe_state feedback line or journal flush in the agent's output"
  fi

  # The safe state, from the registers (the agent is gone: nothing of its
  # own can answer for it).
  s="$(hw 0)/$(hw 1)/$(hw 2)/$(hw 4)"
  if [ "$s" = "out 0/out 1/out 0/out 0" ]; then
    pass "$b-safe-state-registers"
  else
    fail "$b-safe-state-registers" "offsets 0/1/2/4 are '$s', expected 'out 0/out 1/out 0/out 0'"
  fi
  check_pin3 "$b-after"
}

# cdev: after exit the lines must be released (no consumer left in gpiolib)
# with the registers at the safe state. Then the sysfs view agrees too:
# exporting neither changes direction nor level (checked on the registers).
scenario cdev cdev "$CHIP_CDEV"
held=$(for o in 0 1 2 4; do dbg $o; done)
if [ -z "$held" ]; then pass cdev-released; else fail cdev-released "still requested after exit: $held"; fi
ok=1
for o in 0 1 2 4; do
  n=$((BASE + o))
  before=$(hw $o)
  echo $n >/sys/class/gpio/export || { ok="export $n failed"; break; }
  v="$(cat /sys/class/gpio/gpio$n/direction) $(cat /sys/class/gpio/gpio$n/value)"
  after=$(hw $o)
  echo $n >/sys/class/gpio/unexport
  if [ "$v" != "$before" ] || [ "$after" != "$before" ]; then
    ok="offset $o: registers '$before' before export, '$after' after; sysfs reads '$v'"
    break
  fi
done
if [ "$ok" = 1 ]; then pass cdev-safe-state-gpiolib; else fail cdev-safe-state-gpiolib "$ok"; fi

# sysfs: the chip is named by its sysfs directory (by base), as on a box.
scenario sysfs sysfs "$CHIP_SYSFS"
# Lines stay exported (the backend never unexports): gpiolib and the value
# files must agree with the registers.
ok=1
for o in 0 1 2 4; do
  n=$((BASE + o))
  d=$(dbg $o)
  h=$(hw $o)
  v="$(cat /sys/class/gpio/gpio$n/direction 2>&1) $(cat /sys/class/gpio/gpio$n/value 2>&1)"
  case "$d" in
    "sysfs out hi") d="out 1" ;;
    "sysfs out lo") d="out 0" ;;
  esac
  if [ "$d" != "$h" ] || [ "$v" != "$h" ]; then
    ok="offset $o: gpiolib '$d', sysfs '$v', registers '$h'"
    break
  fi
done
if [ "$ok" = 1 ]; then pass sysfs-safe-state-gpiolib; else fail sysfs-safe-state-gpiolib "$ok"; fi

# sysfs again, as after an agent restart (with a fresh journal: the point
# is the lines): they are still exported (export answers EBUSY, which the
# backend must accept) and are outputs at the safe state.
scenario sysfs-again sysfs "$CHIP_SYSFS"

# Those lines stay exported (the sysfs backend never unexports): a cdev
# agent on them is refused, and its error names the sysfs interface as the
# holder (the kernel itself only says EBUSY).
sysfs_holder_named() {
  local name=cdev-on-sysfs-exported-line-names-sysfs d=/tmp/cdev-after-sysfs rc
  mkdir -p "$d"
  write_pack "$CHIP_CDEV" "$d/pack.yaml"
  timeout 60 baton-agent run --no-rt --system-clock reference --gpio cdev \
    --data "$d/data" --pack "$d/pack.yaml" --exit-when-idle >"$d/stdout" 2>"$d/stderr"
  rc=$?
  echo "vm-gpio: cdev on sysfs-exported lines: exit $rc; $(grep -i 'held by' "$d/stderr" | head -n 1)"
  if [ $rc = 0 ]; then
    fail "$name" "the agent exited 0 (expected a refusal)"
  elif ! grep -q 'held by the sysfs interface' "$d/stderr"; then
    fail "$name" "the error does not name sysfs: $(tail -n 3 "$d/stderr")"
  else
    pass "$name"
  fi
}
sysfs_holder_named

# --- 3. Requesting a line does not move it. -------------------------------
# A pack whose only instructions are far in the future: the agent requests
# its lines at acceptance (as-is, read, then output at the level read) and
# must leave them where they were. Offset 6 starts as an output driven high
# (a request as output with a default value would drive it low), offset 7
# as an input (reading 0: nothing drives qemu's pins), which must become an
# output at 0.
hold() { # $1: check name, $2: backend, $3: chip name for the pack
  local name=$1 backend=$2 chip=$3 d=/tmp/hold-$1 consumer pid ok i s o n
  if [ "$backend" = cdev ]; then consumer=baton-agent; else consumer=sysfs; fi
  for o in 6 7; do
    n=$((BASE + o))
    [ -e /sys/class/gpio/gpio$n ] || echo $n >/sys/class/gpio/export
  done
  echo high >/sys/class/gpio/gpio$((BASE + 6))/direction
  echo in >/sys/class/gpio/gpio$((BASE + 7))/direction
  # Unexported again (the PL061 keeps direction and level when a line is
  # freed): cdev cannot request what sysfs holds, and the sysfs backend
  # should take the fresh-export path (the already-exported one is
  # sysfs-again's).
  echo $((BASE + 6)) >/sys/class/gpio/unexport
  echo $((BASE + 7)) >/sys/class/gpio/unexport
  s="$(hw 6)/$(hw 7)"
  [ "$s" = "out 1/in 0" ] || {
    fail "$name" "setup: offsets 6/7 are '$s', expected 'out 1/in 0'"
    return
  }
  mkdir -p "$d"
  cat >"$d/pack.yaml" <<PACK
pack: hold
version: 1
safe_state:
  - {action: gpio.write, params: {chip: "$chip", line: 6, value: 1}}
  - {action: gpio.write, params: {chip: "$chip", line: 7, value: 0}}
instructions:
  - {id: later6, action: gpio.write, params: {chip: "$chip", line: 6, value: 0}, at: "2099-01-01T00:00:00Z"}
  - {id: later7, action: gpio.write, params: {chip: "$chip", line: 7, value: 1}, at: "2099-01-01T00:00:00Z"}
PACK
  baton-agent run --no-rt --system-clock reference --gpio "$backend" --data "$d/data" \
    --pack "$d/pack.yaml" >"$d/stdout" 2>"$d/stderr" &
  pid=$!
  ok=
  for i in $(seq 1 120); do
    grep -q 'accepted pack=default/hold' "$d/stderr" && {
      ok=1
      break
    }
    kill -0 $pid 2>/dev/null || break
    usleep 250000
  done
  # Held (gpiolib shows the agent's claim) at the old levels, for a while.
  s="not accepted"
  for i in 1 2 3 4 5 6 7 8 9 10; do
    [ -n "$ok" ] || break
    s="$(level 6 $consumer)/$(level 7 $consumer)"
    [ "$s" = "out 1/out 0" ] || {
      ok=
      break
    }
    usleep 100000
  done
  kill -TERM $pid
  wait $pid
  if [ -n "$ok" ]; then
    pass "$name"
  else
    fail "$name" "offsets 6/7 '$s' while held (expected 'out 1/out 0', held by $consumer); agent: $(tail -n 2 "$d/stderr")"
  fi
}
hold sysfs-request-does-not-move sysfs "$CHIP_SYSFS"
hold cdev-request-does-not-move cdev "$CHIP_CDEV"

echo "vm-gpio: final registers DIR=$(reg 0x400) DATA=$(reg 0x3fc)"
finish
