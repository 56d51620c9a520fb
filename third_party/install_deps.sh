#!/usr/bin/env bash
# Installs the Debian packages arc_v3 builds and tests with, if any is missing.
# Idempotent: does nothing when all are present. Needs root (or sudo) for apt-get.
set -euo pipefail

PACKAGES=(
  bazel-bootstrap   # Bazel 4.2.3, runs offline with the stand-ins in third_party/stand_in
  g++
  libhwy-dev        # Highway 1.0.3: SIMD kernels with runtime dispatch
  libzstd-dev
  liblz4-dev
  libxxhash-dev
  doctest-dev
  nlohmann-json3-dev  # safetensors headers, bench JSON
  gnuplot-nox         # bench charts
  libcli11-dev        # the checkpoint tool's command line
  # The sync layer (src/sync/): S3 over libcurl, XML answers; its tests run a real S3
  # server (Ceph radosgw, booted by tests/s3/radosgw.sh) and a client nobody here wrote (awscli).
  libcurl4-openssl-dev libpugixml-dev ceph-mon ceph-osd radosgw ceph-common awscli iproute2
  # tests/regions: the region cache of docs/regions.md (nginx with the slice module), curl.
  nginx-light curl
  libmicrohttpd-dev   # follow --events: the endpoint a store's bucket notifications reach
  # Signed steps: Ed25519 and SHA-256 from OpenSSL's libcrypto; its command line in tests.
  libssl-dev openssl
  # The Python binding (python/) and its tests.
  pybind11-dev python3-dev python3-pip python3-setuptools python3-wheel
  python3-numpy python3-pytest python3-torch
  # tests/from_spec/impl/: the decoder written from the specifications alone (plain Python).
  python3-zstandard python3-lz4 python3-xxhash python3-cryptography
  "$@"
)

missing=()
for package in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" ||
    missing+=("$package")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "Installing missing Debian packages: ${missing[*]}" >&2
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get -o DPkg::Lock::Timeout=600 update -q
$SUDO apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends "${missing[@]}"
