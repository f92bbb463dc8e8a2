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
