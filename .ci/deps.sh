#!/usr/bin/env bash
# Install the Debian 12 packages Shardwild needs, skipping those already installed.
# Usage: .ci/deps.sh [--sanitizers]
set -euo pipefail

pkgs=(build-essential cmake pkg-config ninja-build g++ python3 libgloo-dev openmpi-bin
      libdnnl-dev libhwy-dev libtbb-dev libhwloc-dev hwloc libeigen3-dev libabsl-dev
      libyaml-cpp-dev libcli11-dev libspdlog-dev libfmt-dev zlib1g-dev libzstd-dev zstd
      libgtest-dev libgmock-dev googletest libbenchmark-dev nlohmann-json3-dev
      opencl-headers ocl-icd-opencl-dev dataset-fashion-mnist
      libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libcpp-httplib-dev
      python3-matplotlib python3-numpy python3-yaml chromium
      python3-dev pybind11-dev python3-pytest python3-torch libopenblas0-pthread)
# (python3-matplotlib draws `bench sweep`'s report; its tests render the page in headless chromium.)
# (pybind11-dev and python3-dev build the Python package; python3-pytest runs its
#  tests; python3-torch runs its PyTorch tests and examples.)
# (libdnnl-dev is built with the OpenCL GPU runtime; its CMake config needs the OpenCL headers.)

for arg in "$@"; do
  case "$arg" in
    --sanitizers) pkgs+=(clang libclang-rt-14-dev libomp-dev) ;;  # clang's OpenMP for the ASan+UBSan build
    *) echo "deps.sh: unknown argument: $arg" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -eq 0 ]; then
  SUDO=()
elif command -v sudo >/dev/null 2>&1; then
  SUDO=(sudo)
else
  echo "deps.sh: not root and no sudo; cannot install: ${missing[*]}" >&2
  exit 1
fi

echo "deps.sh: installing ${missing[*]}"
"${SUDO[@]}" apt-get update
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
