#!/usr/bin/env bash
# Builds the two container images from the repo's Containerfiles with podman and checks them,
# with no container registry and no Docker engine (see docs/container-images.md):
#   - the gantry image (Containerfile) runs `gantry --version` as a non-root user on a read-only
#     root filesystem without a network; its OCI config has the user, entrypoint, ports and
#     labels the chart assumes; and `/usr/local/bin/gantry place-launcher` (the job pods' init
#     container) places the launcher;
#   - the runner image (Containerfile.runner) runs a tar function that uses the real
#     qiskit-serverless client, through that placed launcher (`gantry launch`), the way a job
#     pod does: read-only, as user 65532, no network, its objects in a local storage folder.
# The bases are Debian bookworm made by debootstrap and kept as local images
# (localhost/gantry-test-base:bookworm, localhost/gantry-test-python:bookworm), so later runs
# reuse them. The gantry binary is the one built on the host (GANTRY_BIN, default
# target/x86_64-unknown-linux-gnu/release/gantry, else .../debug/gantry), static (glibc and
# libgcc linked in; checked): it takes the place of the Containerfile's `build` stage through
# `--build-context build=DIR`, so nothing is compiled here.
# Needs root (apt-get, rootful podman). Exits 0 with a SKIP line only when podman cannot be
# installed. GANTRY_IMAGES_REBUILD_BASES=1 remakes the bases.
set -euo pipefail
cd "$(dirname "$0")/.."
START=$SECONDS

GANTRY_IMAGE=localhost/gantry:test
RUNNER_IMAGE=localhost/gantry-runner:test
BASE=localhost/gantry-test-base:bookworm
PYTHON_BASE=localhost/gantry-test-python:bookworm
SUITE=bookworm

T=$(mktemp -d /tmp/gantry-images.XXXXXX)
cleanup() { rm -rf "$T"; }
trap cleanup EXIT

passed=0 failures=0
pass() { printf 'ok    %s\n' "$*"; passed=$((passed + 1)); }
fail() { printf 'FAIL  %s\n' "$*"; failures=$((failures + 1)); }
die() { printf 'FAIL  %s\n' "$*" >&2; exit 1; }
# Shows the tail of a log after a failed step.
show() { sed 's/^/      | /' "$1" | tail -n "${2:-30}" >&2; }

# --- tools ---------------------------------------------------------------------------------
missing=()
for tool in podman runc debootstrap; do command -v "$tool" >/dev/null || missing+=("$tool"); done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "installing ${missing[*]} (apt-get)"
  if ! { [ "$(id -u)" = 0 ] && export DEBIAN_FRONTEND=noninteractive &&
    apt-get update -qq && apt-get install -y -qq "${missing[@]}"; } >"$T/apt.log" 2>&1; then
    if ! command -v podman >/dev/null; then
      echo "SKIP: container image checks: podman is not installed and cannot be installed here (needs root and Debian's packages)"
      show "$T/apt.log" 5
      exit 0
    fi
    echo "could not install ${missing[*]}:"; show "$T/apt.log" 10
  fi
fi
command -v runc >/dev/null || die "runc is missing (apt-get install runc)"
[ "$(id -u)" = 0 ] || die "run as root: the checks use rootful podman and chown their folders to the job's user"

# runc with the cgroupfs manager and no default ulimits (tests/containers.conf says why).
export CONTAINERS_CONF="$PWD/tests/containers.conf"
pod() { podman --runtime runc "$@"; }

# --- the gantry binary -----------------------------------------------------------------------
BIN=${GANTRY_BIN:-}
if [ -z "$BIN" ]; then
  for candidate in target/x86_64-unknown-linux-gnu/release/gantry target/x86_64-unknown-linux-gnu/debug/gantry; do
    [ -x "$candidate" ] && { BIN=$candidate; break; }
  done
fi
{ [ -n "$BIN" ] && [ -x "$BIN" ]; } || die "no gantry binary: build one (cargo build --release) or set GANTRY_BIN"
# A copy, since the tree's binary may be rebuilt meanwhile; the directory is the build context
# that replaces the Containerfile's `build` stage (it holds what that stage leaves: /out/gantry).
mkdir -p "$T/prebuilt/out"
cp "$BIN" "$T/prebuilt/out/gantry"
# A debug build carries hundreds of MB of debug information the image does not need.
if command -v strip >/dev/null; then strip --strip-debug "$T/prebuilt/out/gantry" || true; fi
VERSION=$(sed -n '/^\[package\]/,/^\[/s/^version *= *"\(.*\)"/\1/p' Cargo.toml | head -n 1)
# The binary must be static (no program interpreter, no shared library needed): the same file
# is placed into job containers as their launcher, whatever their C library.
command -v readelf >/dev/null || die "readelf is missing (apt-get install binutils): cannot check that $BIN is static"
readelf -h "$T/prebuilt/out/gantry" >/dev/null 2>&1 || die "$BIN is not an ELF executable"
interpreter=$(readelf -l "$T/prebuilt/out/gantry" | sed -n 's/.*Requesting program interpreter: \(.*\)]/\1/p')
needed=$(readelf -d "$T/prebuilt/out/gantry" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | paste -sd ' ' -)
if [ -z "$interpreter" ] && [ -z "$needed" ]; then
  echo "gantry binary: $BIN (Cargo.toml version $VERSION; static)"
else
  message="$BIN is dynamically linked (interpreter ${interpreter:-none}; needs ${needed:-nothing}): gantry binaries must be static (glibc and libgcc linked in), as the repository's .cargo/config.toml builds them (target/x86_64-unknown-linux-gnu/)"
  [ "${CI:-}" != true ] || die "$message"
  echo "WARNING: $message (a failure under CI=true)"
fi

# --- the bases -------------------------------------------------------------------------------
# The machine's Debian mirror (debootstrap's own default when none is configured).
mirror=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
[ -n "$mirror" ] || mirror=$(awk '$1 == "deb" {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)

# make_base IMAGE PACKAGES: a minbase Debian with PACKAGES, imported as IMAGE, unless present.
make_base() {
  local image=$1 packages=$2 rootfs="$T/rootfs" began=$SECONDS
  if [ -z "${GANTRY_IMAGES_REBUILD_BASES:-}" ] && pod image exists "$image"; then
    echo "base $image: cached"
    return
  fi
  command -v debootstrap >/dev/null || die "debootstrap is missing (apt-get install debootstrap)"
  echo "base $image: debootstrap $SUITE with $packages"
  mkdir -p "$T/debs"  # one download of the packages both bases share
  # shellcheck disable=SC2086  # the mirror is one word or none
  if ! debootstrap --variant=minbase --cache-dir="$T/debs" --include="$packages" "$SUITE" "$rootfs" $mirror \
    >"$T/debootstrap.log" 2>&1; then
    show "$T/debootstrap.log"
    die "debootstrap of $image failed"
  fi
  # What a container base does without: package caches and lists, documentation, locales.
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/lib/apt/lists/* \
    "$rootfs"/var/log/* "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* \
    "$rootfs"/usr/share/locale/*
  tar -C "$rootfs" -c . | pod import -q --change 'CMD ["/bin/bash"]' - "$image" >/dev/null
  rm -rf "$rootfs"
  echo "base $image: made in $((SECONDS - began)) s"
}
make_base "$BASE" ca-certificates
make_base "$PYTHON_BASE" python3,python3-venv,ca-certificates

# --- the images ------------------------------------------------------------------------------
# build IMAGE LOG ARGS...: builds and tags IMAGE, dropping the image it replaces.
build() {
  local image=$1 log=$2 previous began=$SECONDS
  shift 2
  previous=$(pod image inspect --format '{{.Id}}' "$image" 2>/dev/null || true)
  if ! pod build -q --pull=never --build-arg VERSION="$VERSION" -t "$image" "$@" . >"$log" 2>&1; then
    show "$log"
    die "podman build of $image failed"
  fi
  local id
  id=$(pod image inspect --format '{{.Id}}' "$image")
  if [ -n "$previous" ] && [ "$previous" != "$id" ]; then pod rmi "$previous" >/dev/null 2>&1 || true; fi
  echo "image $image: built in $((SECONDS - began)) s ($(pod image inspect --format '{{.Size}}' "$image" | awk '{printf "%d MB", $1 / 1e6}'))"
}
# The build stage is replaced by the host's binary: nothing is compiled.
build "$GANTRY_IMAGE" "$T/build-gantry.log" -f Containerfile --build-context build="$T/prebuilt" \
  --build-arg BASE_IMAGE="$BASE"
# pip verifies TLS with the host's roots, lent as a build secret (not kept in the image).
ca=${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}
secret=()
[ -s "$ca" ] && secret=(--secret "id=ca,src=$ca")
build "$RUNNER_IMAGE" "$T/build-runner.log" -f Containerfile.runner "${secret[@]}" \
  --build-arg BASE_IMAGE="$PYTHON_BASE"

# --- checks ----------------------------------------------------------------------------------
echo "checks:"
# count LINES: adds the ok and FAIL lines printed by a Python check to the totals.
count() {
  passed=$((passed + $(grep -c '^ok' <<<"$1" || true)))
  failures=$((failures + $(grep -c '^FAIL' <<<"$1" || true)))
}
# What a job pod's containers get: read-only root, no capabilities, no privilege escalation,
# and here no network.
restricted=(--rm --read-only --network none --cap-drop all --security-opt no-new-privileges)

# (a) `gantry --version` as the image's own (non-root) user on a read-only root.
if out=$(pod run "${restricted[@]}" "$GANTRY_IMAGE" --version 2>&1) && [[ "$out" == *"$VERSION"* ]]; then
  pass "gantry image: \`gantry --version\` on a read-only root, no network: $out"
else
  fail "gantry image: \`gantry --version\` printed '$out', expected version $VERSION"
fi
uid=$(pod run "${restricted[@]}" --entrypoint /usr/bin/id "$GANTRY_IMAGE" -u 2>&1 || true)
if [ "$uid" = 65532 ]; then pass "gantry image: runs as uid 65532 (non-root)"; else fail "gantry image: runs as uid '$uid'"; fi

# (b) The OCI config as a registry would serve it: index.json -> manifest -> config.
# oci_config IMAGE FILE: writes IMAGE's config JSON to FILE.
oci_config() {
  pod save -q --format oci-archive -o "$T/image.tar" "$1" >/dev/null
  python3 - "$T/image.tar" >"$2" <<'PY'
import json, sys, tarfile
with tarfile.open(sys.argv[1]) as archive:
    def blob(digest):
        return json.load(archive.extractfile("blobs/" + digest.replace(":", "/")))
    manifest = blob(json.load(archive.extractfile("index.json"))["manifests"][0]["digest"])
    json.dump(blob(manifest["config"]["digest"]), sys.stdout)
PY
  rm -f "$T/image.tar"
}
oci_config "$GANTRY_IMAGE" "$T/gantry-config.json"
oci_config "$RUNNER_IMAGE" "$T/runner-config.json"
# What the chart assumes of the images (charts/gantry/values.yaml): the binary's path (the
# roles' command and the job pods' launcher source) and the user its pods run as.
chart_value() { awk -v section="$1" -v key="$2" '
  /^[^ #]/ { in_section = ($0 ~ "^" section ":") }
  in_section && $1 == key ":" { gsub(/"/, "", $2); print $2; exit }' charts/gantry/values.yaml; }
CHART_BINARY=$(chart_value image binaryPath)
CHART_LAUNCHER=$(chart_value jobs launcherSource)
CHART_UID=$(chart_value podSecurityContext runAsUser)
CHART_JOB_UID=$(chart_value jobs user)
results=$(python3 - "$T/gantry-config.json" "$T/runner-config.json" "$VERSION" \
  "$CHART_BINARY" "$CHART_LAUNCHER" "$CHART_UID" "$CHART_JOB_UID" <<'PY'
import json, sys
gantry, runner = (json.load(open(path))["config"] for path in sys.argv[1:3])
version = sys.argv[3]
chart_binary, chart_launcher, chart_uid, chart_job_uid = sys.argv[4:8]
def check(ok, what, seen):
    print(f"{'ok   ' if ok else 'FAIL '} {what}" + ("" if ok else f" (seen: {seen!r})"))
def labels(config, title):
    found = config.get("Labels") or {}
    want = {"org.opencontainers.image.title": title, "org.opencontainers.image.version": version,
            "org.opencontainers.image.licenses": "Apache-2.0"}
    return all(found.get(k) == v for k, v in want.items()) and all(
        found.get(f"org.opencontainers.image.{k}") for k in ("description", "source")), found
check(gantry.get("User") == "65532:65532", "gantry image config: User 65532:65532", gantry.get("User"))
check(gantry.get("Entrypoint") == ["/usr/local/bin/gantry"], "gantry image config: Entrypoint [/usr/local/bin/gantry]", gantry.get("Entrypoint"))
check(gantry.get("Cmd") == ["gateway"], "gantry image config: Cmd [gateway]", gantry.get("Cmd"))
check(set(gantry.get("ExposedPorts") or {}) == {"8000/tcp", "9090/tcp"}, "gantry image config: ports 8000 and 9090", gantry.get("ExposedPorts"))
ok, found = labels(gantry, "gantry")
check(ok, f"gantry image config: OCI labels title/description/source/licenses/version={version}", found)
check(runner.get("User") == "65532:65532", "runner image config: User 65532:65532", runner.get("User"))
binary = (gantry.get("Entrypoint") or [""])[0]
check(binary == chart_binary == chart_launcher,
      f"the chart's image.binaryPath and jobs.launcherSource are the image's binary ({binary})",
      (chart_binary, chart_launcher))
check(gantry.get("User", "").split(":")[0] == chart_uid and runner.get("User", "").split(":")[0] == chart_job_uid,
      f"the chart's podSecurityContext.runAsUser ({chart_uid}) and jobs.user ({chart_job_uid}) are the images' users",
      (gantry.get("User"), runner.get("User")))
check(runner.get("WorkingDir") == "/work", "runner image config: WorkingDir /work", runner.get("WorkingDir"))
path = next((e for e in runner.get("Env", []) if e.startswith("PATH=")), "")
check(path.startswith("PATH=/opt/venv/bin:"), "runner image config: the venv first on PATH", path)
ok, found = labels(runner, "gantry-runner")
check(ok, f"runner image config: OCI labels title/description/source/licenses/version={version}", found)
PY
)
echo "$results"
count "$results"

# (b) The init container's command, as the controller writes it, places the launcher in a
# shared volume (the pod's emptyDir; here a folder owned by the job's user).
mkdir -p "$T/launcher"
chown 65532:65532 "$T/launcher"
if pod run "${restricted[@]}" -v "$T/launcher:/gantry" --entrypoint /usr/local/bin/gantry "$GANTRY_IMAGE" \
  place-launcher /gantry/gantry >"$T/place.log" 2>&1 &&
  [ -x "$T/launcher/gantry" ] && cmp -s "$T/launcher/gantry" "$T/prebuilt/out/gantry"; then
  pass "gantry image: \`/usr/local/bin/gantry place-launcher /gantry/gantry\` places the launcher (executable, identical)"
else
  fail "gantry image: place-launcher did not place the launcher"; show "$T/place.log"
fi

# (c) A tar function using the real client, run by that launcher in the runner image as a job
# pod runs it: the pod's variables, /work and /data as scratch volumes, the job's objects in a
# local storage folder (a pod reaches them through presigned URLs instead).
JOB=0f2c0000-0000-4000-8000-00000000a1b2
ARTIFACT=artifacts/images-check/upload-1.tar
STORE="$T/store"
mkdir -p "$T/function/helpers" "$STORE/artifacts/images-check" "$STORE/jobs/$JOB"
cat >"$T/function/main.py" <<'PY'
"""A function as users upload it: its arguments in, a line printed, a result saved."""
import os
import sys
from importlib.metadata import version

from qiskit import QuantumCircuit
from qiskit_serverless import get_arguments, save_result

from helpers import total

arguments = get_arguments()
circuit = QuantumCircuit(2)
circuit.h(0)
circuit.cx(0, 1)
circuit.measure_all()
print(f"hello {arguments['name']} from the runner image")
save_result({
    "total": total(arguments["numbers"]),
    "circuit": circuit,
    "python": sys.executable,
    "client": version("qiskit-serverless"),
    "uid": os.getuid(),
})
PY
printf 'def total(numbers):\n    return sum(numbers)\n' >"$T/function/helpers/__init__.py"
tar -C "$T/function" -cf "$STORE/$ARTIFACT" main.py helpers
printf '%s' '{"name": "podman", "numbers": [1, 2, 3]}' >"$STORE/jobs/$JOB/arguments.json"
chown -R 65532:65532 "$STORE"
began=$SECONDS
status=0
pod run "${restricted[@]}" --user 65532:65532 \
  -v "$T/launcher:/gantry:ro" -v "$STORE:/store" --tmpfs /work:U --tmpfs /data:U \
  -e GANTRY_JOB_ID="$JOB" -e GANTRY_WORK_DIR=/work -e GANTRY_STORAGE=/store \
  -e GANTRY_ARTIFACT_KEY="$ARTIFACT" -e GANTRY_ENTRYPOINT=main.py -e HOME=/work \
  -e ENV_JOB_ID_GATEWAY="$JOB" -e ENV_JOB_GATEWAY_HOST=http://127.0.0.1:1 -e QISKIT_IBM_CHANNEL=local \
  -e DATA_PATH=/data -e ARGUMENTS_PATH="/data/arguments/$JOB.json" -e RESULTS_PATH="/data/results/$JOB.json" \
  --entrypoint /gantry/gantry "$RUNNER_IMAGE" launch >"$T/launch.log" 2>&1 || status=$?
results=$(python3 - "$STORE/jobs/$JOB" "$status" <<'PY'
import json, pathlib, sys
job, status = pathlib.Path(sys.argv[1]), int(sys.argv[2])
def check(ok, what, seen=None):
    print(f"{'ok   ' if ok else 'FAIL '} {what}" + ("" if ok else f" (seen: {seen!r})"))
def read(name):
    try:
        return (job / name).read_text()
    except OSError as e:
        return f"<{e}>"
exit_record = read("exit.json")
try:
    record = json.loads(exit_record)
except ValueError:
    record = {}
check(status == 0 and record.get("exit_code") == 0 and not record.get("error"),
      "runner image: `gantry launch` ran the tar function as uid 65532, read-only, no network: exit record exit_code 0",
      (status, exit_record))
log = read("user.log")
check("hello podman from the runner image" in log, "runner image: the function's output is in the archived user log", log[-500:])
text = read("result.json")
try:
    result = json.loads(text)
except ValueError:
    result = {}
circuit = result.get("circuit") if isinstance(result.get("circuit"), dict) else {}
check(result.get("total") == 6 and result.get("uid") == 65532,
      "runner image: get_arguments() read the arguments and save_result() saved the result (total 6)", text[:300])
check(result.get("client") == "0.37.0" and str(result.get("python", "")).startswith("/opt/venv/"),
      "runner image: `python3` is the venv's, with qiskit-serverless 0.37.0", text[:300])
check(circuit.get("__type__") == "QuantumCircuit",
      "runner image: the client's encoder saved a QuantumCircuit (Qiskit installed and working)", text[:300])
PY
)
echo "$results"
count "$results"
echo "      (the job's container ran $((SECONDS - began)) s; archived user log and result:)"
sed 's/^/      | /' "$STORE/jobs/$JOB/user.log" 2>/dev/null || true
cut -c 1-150 "$STORE/jobs/$JOB/result.json" 2>/dev/null | sed 's/^/      | /; s/$/.../' || true
if grep -q '^FAIL' <<<"$results"; then show "$T/launch.log" 40; fi

echo "(images: $((SECONDS - START)) s in all)"
echo "images: $passed passed, $failures failed"
[ "$failures" = 0 ]
