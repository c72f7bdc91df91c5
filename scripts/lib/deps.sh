# Installs the Debian 12 packages ckptfs needs to build, test and run its
# demo. Sourced by scripts/test.sh and scripts/demo.sh. Only calls apt-get
# when something is missing, so repeated runs are fast.

CKPTFS_PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  libfuse3-dev fuse3
  libzstd-dev zstd libxxhash-dev libfmt-dev libdeflate-dev
  libcli11-dev nlohmann-json3-dev libspdlog-dev libtomlplusplus-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  clang-14 libclang-rt-14-dev
  python3-torch python3-numpy python3-pytest python3-sklearn python3-matplotlib libopenblas0-pthread
  fortunes
  unzip attr procps strace
  glusterfs-server glusterfs-client
)

ckptfs_install_deps() {
  local missing=()
  local p
  for p in "${CKPTFS_PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
      missing+=("$p")
    fi
  done
  if [ ${#missing[@]} -eq 0 ]; then
    return 0
  fi
  echo "== installing: ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

# The Python that has Debian's torch and numpy (a different python3 may come
# first on PATH).
CKPTFS_PYTHON=/usr/bin/python3

# Installs what is missing, then configures the release build in build/ and
# builds the given targets quietly (the benchmarks' common start).
ckptfs_build() {
  ckptfs_install_deps
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  ninja -C build "$@" >/dev/null
}
