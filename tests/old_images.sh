#!/usr/bin/env bash
# The launcher needs nothing from an image but a Python: container-image functions on
# `gantry serve`, with the real client and podman, in images the gantry binary was never built
# for. The binary (GANTRY_BIN) is static, so placed into the container as its launcher it needs
# no C library, no libgcc_s, no shell from the image. Two images, built here and never pulled:
#   - Debian 11 (bullseye, glibc 2.31) made by debootstrap (minbase with python3) from the
#     machine's Debian mirror (GANTRY_OLD_IMAGES_MIRROR names another, e.g. an archive of old
#     releases);
#   - a root filesystem holding only a Python interpreter (GANTRY_PLAIN_PYTHON, default the
#     machine's /usr/bin/python3), the shared libraries `ldd` lists for it and its standard
#     library (no site-packages, dist-packages or tests), with no libgcc_s and no shell.
# Both are kept as local images (localhost/gantry-test-python:bullseye,
# localhost/gantry-test-python-only:<version>), made again when missing or with
# GANTRY_IMAGES_REBUILD_BASES=1; each gets tests/e2e/functions/plain_image/main.py (standard
# library only) at /runner/main.py in a layer of its own. tests/e2e/client_old_images.py then
# runs it through the real client and checks it SUCCEEDED in that image (its /etc/os-release,
# its C library's version). A dynamically linked launcher failed there with
# "version `GLIBC_2.32' not found" and "libgcc_s.so.1: cannot open shared object file".
# Needs root (apt-get, rootful podman) and GANTRY_TEST_PYTHON (a Python with qiskit-serverless
# 0.37.0; default .venv/bin/python or /var/tmp/gantry-ci-venv/bin/python). Installs podman,
# runc and debootstrap when missing; under CI=true nothing missing is skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
START=$SECONDS
BIN=${GANTRY_BIN:-target/x86_64-unknown-linux-gnu/debug/gantry}
BULLSEYE_BASE=localhost/gantry-test-python:bullseye
BULLSEYE_IMAGE=localhost/gantry-old-image-bullseye:test
PLAIN_IMAGE=localhost/gantry-old-image-python-only:test
PLAIN_PYTHON=$(readlink -f "${GANTRY_PLAIN_PYTHON:-/usr/bin/python3}")

missing() {
  if [ "${CI:-}" = true ]; then echo "FAIL old images: $*" >&2; exit 1; fi
  echo "SKIP: old images: $*"; exit 0
}
die() { echo "FAIL old images: $*" >&2; exit 1; }

PYTHON=${GANTRY_TEST_PYTHON:-}
if [ -z "$PYTHON" ]; then
  for candidate in .venv/bin/python /var/tmp/gantry-ci-venv/bin/python; do
    "$candidate" -c 'import qiskit_serverless' >/dev/null 2>&1 && { PYTHON=$candidate; break; }
  done
fi
[ -n "$PYTHON" ] || missing "no Python with qiskit-serverless (set GANTRY_TEST_PYTHON; .ci/run makes .venv)"
[ "$(id -u)" = 0 ] || missing "needs root (apt-get, rootful podman)"
[ -x "$BIN" ] || die "no gantry binary at $BIN: build it first (cargo build) or set GANTRY_BIN"

T=$(mktemp -d /tmp/gantry-old-images.XXXXXX)
trap 'rm -rf "$T"' EXIT
show() { sed 's/^/      | /' "$1" | tail -n "${2:-30}" >&2; }

# --- tools: as tests/images.sh -----------------------------------------------------------------
tools=()
for tool in podman runc debootstrap; do command -v "$tool" >/dev/null || tools+=("$tool"); done
if [ "${#tools[@]}" -gt 0 ]; then
  echo "installing ${tools[*]} (apt-get)"
  { export DEBIAN_FRONTEND=noninteractive && apt-get update -qq && apt-get install -y -qq "${tools[@]}"; } \
    >"$T/apt.log" 2>&1 || { show "$T/apt.log" 10; missing "could not install ${tools[*]}"; }
fi
command -v readelf >/dev/null || missing "readelf is missing (apt-get install binutils)"

# runc with the cgroupfs manager and no default ulimits (tests/containers.conf says why).
export CONTAINERS_CONF="$PWD/tests/containers.conf"
pod() { podman --runtime runc "$@"; }

# --- the launcher: a copy of the binary, which must be static -----------------------------------
cp "$BIN" "$T/gantry"
if readelf -l "$T/gantry" | grep -q 'Requesting program interpreter'; then
  die "$BIN is dynamically linked ($(readelf -l "$T/gantry" | sed -n 's/.*interpreter: \(.*\)]/\1/p')): the launcher must be static, as .cargo/config.toml builds it"
fi
echo "gantry binary: $BIN (static: no program interpreter)"

# --- the bases ---------------------------------------------------------------------------------
# The machine's Debian mirror, as tests/images.sh finds it.
mirror=${GANTRY_OLD_IMAGES_MIRROR:-}
[ -n "$mirror" ] || mirror=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
[ -n "$mirror" ] || mirror=$(awk '$1 == "deb" {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)

cached() {
  if [ -z "${GANTRY_IMAGES_REBUILD_BASES:-}" ] && pod image exists "$1"; then
    echo "base $1: cached"
    return 0
  fi
  return 1
}
# import_rootfs ROOTFS IMAGE: the folder as a one-layer local image.
import_rootfs() {
  tar -C "$1" -c . | pod import -q --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin' \
    --change 'CMD ["/usr/bin/python3"]' - "$2" >/dev/null
}

# Debian 11 with python3, by debootstrap.
make_bullseye() {
  local rootfs="$T/bullseye" began=$SECONDS
  cached "$BULLSEYE_BASE" && return
  command -v debootstrap >/dev/null || missing "debootstrap is missing (apt-get install debootstrap)"
  echo "base $BULLSEYE_BASE: debootstrap bullseye (minbase, python3) from ${mirror:-the default mirror}"
  # shellcheck disable=SC2086  # the mirror is one word or none
  if ! timeout 1800 debootstrap --variant=minbase --include=python3 bullseye "$rootfs" $mirror >"$T/debootstrap.log" 2>&1; then
    show "$T/debootstrap.log"
    die "debootstrap of bullseye failed (is bullseye on ${mirror:-the default mirror}? GANTRY_OLD_IMAGES_MIRROR names another)"
  fi
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/lib/apt/lists/* \
    "$rootfs"/var/log/* "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* \
    "$rootfs"/usr/share/locale/*
  import_rootfs "$rootfs" "$BULLSEYE_BASE"
  rm -rf "$rootfs"
  echo "base $BULLSEYE_BASE: made in $((SECONDS - began)) s"
}

# A Python alone: the interpreter, what ldd lists for it, its standard library.
make_plain() {
  local rootfs="$T/plain" began=$SECONDS library found
  cached "$PLAIN_BASE" && return
  echo "base $PLAIN_BASE: $PLAIN_PYTHON, its ldd libraries and $stdlib_dir only"
  # A merged /usr, as Debian's: the libraries land where ldd names them (/lib, /lib64).
  mkdir -p "$rootfs"/usr/bin "$rootfs"/usr/lib "$rootfs"/usr/lib64 "$rootfs"/dev "$rootfs"/proc \
    "$rootfs"/sys "$rootfs"/tmp "$rootfs"/etc "$rootfs"/run "$rootfs"/var/tmp
  chmod 1777 "$rootfs"/tmp "$rootfs"/var/tmp
  ln -s usr/lib "$rootfs"/lib
  ln -s usr/lib64 "$rootfs"/lib64
  cp "$PLAIN_PYTHON" "$rootfs/usr/bin/$(basename "$PLAIN_PYTHON")"
  ln -s "$(basename "$PLAIN_PYTHON")" "$rootfs"/usr/bin/python3
  # `libm.so.6 => /lib/x86_64-linux-gnu/libm.so.6 (0x...)` and `/lib64/ld-linux-x86-64.so.2 (0x...)`.
  ldd "$PLAIN_PYTHON" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' >"$T/libraries"
  [ -s "$T/libraries" ] || die "ldd listed no library for $PLAIN_PYTHON"
  while read -r library; do
    mkdir -p "$rootfs$(dirname "$library")"
    cp -L "$library" "$rootfs$library"
  done <"$T/libraries"
  mkdir -p "$rootfs$stdlib_dir"
  tar -C "$stdlib_dir" -c --exclude=./site-packages --exclude=./dist-packages --exclude=./test \
    --exclude='*/test' --exclude='*/tests' --exclude='*/idle_test' . | tar -C "$rootfs$stdlib_dir" -x
  found=$(find "$rootfs" -name 'libgcc_s.so*')
  [ -z "$found" ] || die "the Python-only root filesystem holds libgcc_s: $found"
  [ ! -e "$rootfs"/bin/sh ] && [ ! -e "$rootfs"/usr/bin/sh ] || die "the Python-only root filesystem holds a shell"
  echo "base $PLAIN_BASE: $(paste -sd ' ' - <"$T/libraries"), $(du -sm "$rootfs" | cut -f1) MB, no libgcc_s, no shell"
  import_rootfs "$rootfs" "$PLAIN_BASE"
  rm -rf "$rootfs"
  echo "base $PLAIN_BASE: made in $((SECONDS - began)) s"
}

[ -x "$PLAIN_PYTHON" ] || missing "no Python at $PLAIN_PYTHON for the Python-only image (GANTRY_PLAIN_PYTHON)"
stdlib_dir=$("$PLAIN_PYTHON" -S -c 'import sysconfig; print(sysconfig.get_path("stdlib"))')
PLAIN_VERSION=$("$PLAIN_PYTHON" -S -c 'import sys; print("%d.%d" % sys.version_info[:2])')
PLAIN_BASE=localhost/gantry-test-python-only:$PLAIN_VERSION
make_bullseye
make_plain

# --- the provider images: the function at /runner/main.py ------------------------------------------
# function_image BASE IMAGE: BASE plus the function (a COPY: no shell is needed in BASE).
function_image() {
  local base=$1 image=$2 began=$SECONDS previous id
  previous=$(pod image inspect --format '{{.Id}}' "$image" 2>/dev/null || true)
  mkdir -p "$T/context"
  cp tests/e2e/functions/plain_image/main.py "$T/context/main.py"
  printf 'FROM %s\nCOPY main.py /runner/main.py\n' "$base" >"$T/context/Containerfile"
  pod build -q --pull=never -t "$image" -f "$T/context/Containerfile" "$T/context" >"$T/build.log" 2>&1 ||
    { show "$T/build.log"; die "podman build of $image failed"; }
  id=$(pod image inspect --format '{{.Id}}' "$image")
  if [ -n "$previous" ] && [ "$previous" != "$id" ]; then pod rmi "$previous" >/dev/null 2>&1 || true; fi
  echo "provider image $image: built from $base in $((SECONDS - began)) s"
}
function_image "$BULLSEYE_BASE" "$BULLSEYE_IMAGE"
function_image "$PLAIN_BASE" "$PLAIN_IMAGE"

status=0
"$PYTHON" tests/e2e/client_old_images.py "$(cd "$(dirname "$T/gantry")" && pwd)/gantry" "podman" \
  "bullseye=$BULLSEYE_IMAGE" "python-only=$PLAIN_IMAGE" || status=$?
echo "(old images: $((SECONDS - START)) s in all)"
exit "$status"
