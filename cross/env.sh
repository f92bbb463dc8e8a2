# Sourced by the cross/ scripts: per-target toolchain facts, and the
# install of what is missing (the rust target by rustup, Debian's cross gcc
# and libc by apt-get, as root). Sets CC_<triple>/AR_<triple> for the cc
# crate (ring, bundled SQLite compile C), never the plain CC/AR, which would
# also apply to build scripts compiled for the host.
#
# cross_setup TARGET [EXTRA_DEBIAN_PACKAGE...]

cross_setup() {
  local target=$1
  shift
  local prefix debs=()
  case "$target" in
    aarch64-unknown-linux-gnu | aarch64-unknown-linux-musl)
      prefix=aarch64-linux-gnu
      debs=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross binutils-aarch64-linux-gnu)
      CROSS_DEB_ARCH=arm64
      CROSS_QEMU=qemu-aarch64-static
      ;;
    armv7-unknown-linux-gnueabihf)
      prefix=arm-linux-gnueabihf
      debs=(gcc-arm-linux-gnueabihf libc6-dev-armhf-cross binutils-arm-linux-gnueabihf)
      CROSS_DEB_ARCH=armhf
      CROSS_QEMU=qemu-arm-static
      ;;
    x86_64-unknown-linux-gnu)
      # The host (for the amd64 .deb): no cross toolchain.
      prefix=
      CROSS_DEB_ARCH=amd64
      CROSS_QEMU=
      ;;
    *)
      echo "cross: unsupported target $target" >&2
      echo "  (aarch64-unknown-linux-gnu, armv7-unknown-linux-gnueabihf," >&2
      echo "   aarch64-unknown-linux-musl, x86_64-unknown-linux-gnu)" >&2
      return 2
      ;;
  esac
  debs+=("$@")

  if ! rustup target list --installed | grep -qx "$target"; then
    echo "cross: rustup target add $target" >&2
    rustup target add "$target"
  fi

  local missing=() d
  for d in "${debs[@]}"; do
    dpkg-query -W -f='${Status}' "$d" 2>/dev/null | grep -q 'ok installed' || missing+=("$d")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ]; then
      echo "cross: apt-get install ${missing[*]}" >&2
      apt-get update -qq
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    else
      echo "cross: missing Debian packages ${missing[*]} (apt-get install them as root)" >&2
      return 1
    fi
  fi

  local t=${target//-/_}
  if [ -n "$prefix" ]; then
    export "CC_$t=$prefix-gcc" "AR_$t=$prefix-ar"
    CROSS_STRIP=$prefix-strip
  else
    CROSS_STRIP=strip
  fi
  export CROSS_DEB_ARCH CROSS_QEMU CROSS_STRIP
}

# cross_binfmt: the kernel runs aarch64 ELF images through qemu-user
# (binfmt_misc), so that an aarch64 process under test can execute another
# aarch64 image: the launcher's `execve` of an installed build, which
# cargo's runner (it wraps the test executable only) does not cover.
# Registers the entry qemu-user-static ships in binfmt.d (no systemd runs
# it where CI runs), mounting binfmt_misc first if need be: root. The
# images are dynamic: QEMU_LD_PREFIX points qemu at the cross libc.
cross_binfmt() {
  local fs=/proc/sys/fs/binfmt_misc conf=/usr/lib/binfmt.d/qemu-aarch64.conf
  if [ ! -e "$fs/qemu-aarch64" ]; then
    if [ "$(id -u)" != 0 ]; then
      echo "cross: no qemu-aarch64 binfmt_misc entry (register it as root: $conf)" >&2
      return 1
    fi
    [ -e "$fs/register" ] || mount -t binfmt_misc binfmt_misc "$fs"
    [ -e "$conf" ] || {
      echo "cross: $conf missing (Debian qemu-user-static)" >&2
      return 1
    }
    cat "$conf" >"$fs/register"
  fi
  if [ "$(head -n1 "$fs/qemu-aarch64")" != enabled ]; then
    echo "cross: the qemu-aarch64 binfmt_misc entry is disabled" >&2
    return 1
  fi
  export QEMU_LD_PREFIX=/usr/aarch64-linux-gnu
}
