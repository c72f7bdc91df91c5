# The one sanitizer build (build-sanitize/), shared by the unit tests under
# ASan + UBSan (scripts/test.sh) and the libFuzzer targets (scripts/fuzz.sh):
# clang-14 with AddressSanitizer, UndefinedBehaviorSanitizer and the fuzzers'
# coverage instrumentation, at -O1 with assertions on (no NDEBUG). One build
# for both compiles the libraries once instead of twice. Sourced; call from
# the repository root.

CKPTFS_SANITIZE_BUILD=build-sanitize

ckptfs_configure_sanitize_build() {
  cmake -S . -B "$CKPTFS_SANITIZE_BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g" "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g" \
    -DCKPTFS_SANITIZE=ON -DCKPTFS_FUZZ=ON -DCKPTFS_BUILD_TESTS=ON \
    -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 \
    -DCMAKE_CUDA_HOST_COMPILER=g++ >/dev/null
}
