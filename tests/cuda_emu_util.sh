# cuda_emu_util.sh — runs CUDA device code on the CPU: a tests/*_emu.cpp includes the kernels with the
# hardware's primitives emulated; this builds it with the host's C++ compiler (and make test-asan's
# sanitizers, PDDE_TEST_SANITIZE) and counts its cases.
# usage (after tests/script_util.sh): run_emulation SOURCE MIN_CASES
run_emulation() {
    local src=$1 min=$2 cxx=${CXX:-c++} bin="$tmp/$(basename "$1" .cpp)"
    if ! command -v "$cxx" >/dev/null 2>&1; then
        echo "SKIP c++: no C++ compiler ($cxx) to build $src"
        return
    fi
    # shellcheck disable=SC2086 # (PDDE_TEST_SANITIZE: make test-asan's flags, words apart)
    "$cxx" -std=c++17 -O2 -Wall -Wextra -Werror -Wno-unknown-pragmas ${PDDE_TEST_SANITIZE:-} "$src" -o "$bin" >"$tmp/build.log" 2>&1
    local rc=$?
    check "$src builds ($(head -3 "$tmp/build.log"))" $rc
    [ $rc = 0 ] || return
    "$bin" >"$tmp/run.log" 2>&1
    rc=$?
    grep -E '^FAIL' "$tmp/run.log"
    local line n_ok n_bad
    line=$(tail -1 "$tmp/run.log")
    n_ok=$(echo "$line" | awk '/passed/ {print $1}'); n_bad=$(echo "$line" | awk '/passed/ {print $3}')
    pass=$((pass + ${n_ok:-0})); fail=$((fail + ${n_bad:-0}))
    [ $rc = 0 ] && [ "${n_ok:-0}" -ge "$min" ]
    check "the emulation ran every case ($line, exit $rc; at least $min)" $?
}
