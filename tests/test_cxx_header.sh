#!/usr/bin/env bash
# A C++ codebase includes pdde: pdde.h and pdde_extension.h compile as C++17 with -Wall -Wextra
# -Wpedantic -Werror (extern "C", every PDDE_*_INIT macro, a plugin's host->error returned as a
# pdde_status), and a C++ program (the README's MLP) links against this build's libpdde.a and trains.
# Run from the repository root: build/test_cxx_header.
. tests/script_util.sh cxx-header
cxx=${CXX:-c++}
command -v "$cxx" >/dev/null || { echo "SKIP: no C++ compiler ($cxx)"; echo "0 passed, 0 failed, 1 skipped"; exit 0; }

# every struct initializer macro the headers define, with the struct it follows (so a new one is covered too)
mapfile -t inits < <(awk '/^} [a-z_]+;/ { t = $2; sub(";", "", t) } /^#define PDDE_[A-Z0-9_]*_INIT \{/ { print $2, t }' pdde.h pdde_extension.h)
[ "${#inits[@]}" -ge 10 ]; check "the headers define at least 10 struct *_INIT macros (${#inits[@]})" $?
{
    echo '#include "pdde.h"'
    echo '#include "pdde_extension.h"'
    echo '#include <cstdio>'
    echo '#include <vector>'
    for line in "${inits[@]}"; do
        read -r m t <<<"$line"
        echo "[[maybe_unused]] static $t init_${t} = $m;"
    done
    cat <<'CPP'
/* what a backend written in C++ returns from its calls */
static pdde_status refuse(const pdde_backend_host *host, pdde_context *ctx) {
    return host->error(ctx, PDDE_ERR_UNAVAILABLE, "toy: %s", "not here");
}

int main() {
    (void)refuse;
    pdde_context *ctx = nullptr;
    pdde_graph *g = nullptr;
    pdde_session *s = nullptr;
    if (pdde_context_init(nullptr, &ctx) || pdde_graph_init(ctx, &g)) return 1;
    const int64_t xs[] = {64, 10}, ts[] = {64}, w1s[] = {10, 32}, b1s[] = {32}, w2s[] = {32, 3};
    pdde_tensor *x = pdde_input(g, "x", PDDE_F32, 2, xs), *t = pdde_input(g, "target", PDDE_I32, 1, ts);
    pdde_tensor *w1 = pdde_param(g, "w1", 2, w1s, 0.3f), *b1 = pdde_param(g, "b1", 1, b1s, 0.0f), *w2 = pdde_param(g, "w2", 2, w2s, 0.3f);
    pdde_tensor *h = pdde_relu(g, pdde_bias_add(g, pdde_matmul(g, x, w1, 0, 0), b1));
    pdde_backward(g, pdde_cross_entropy(g, pdde_matmul(g, h, w2, 0, 0), t));
    pdde_optimizer_params opt = PDDE_OPTIMIZER_PARAMS_INIT;
    opt.lr = 1e-2f;
    pdde_optimizer_adamw(g, &opt);
    if (pdde_graph_status(g) || pdde_session_init(g, nullptr, &s)) { std::fprintf(stderr, "%s\n", pdde_last_error(ctx)); return 1; }
    std::vector<float> xv(64 * 10);
    std::vector<int32_t> tv(64);
    for (int i = 0; i < 64; i++) tv[i] = i % 3, xv[i * 10 + i % 3] = 1.0f; /* the class is the hot column */
    float first = 0, last = 0;
    for (int step = 0; step < 50; step++) {
        pdde_session_write(s, x, xv.data(), xv.size() * sizeof(float));
        pdde_session_write(s, t, tv.data(), tv.size() * sizeof(int32_t));
        if (pdde_session_run(s, PDDE_RUN_STEP)) { std::fprintf(stderr, "%s\n", pdde_last_error(ctx)); return 1; }
        (step ? last : first) = pdde_session_loss(s);
    }
    std::printf("loss %.4f -> %.4f\n", first, last);
    pdde_session_free(s), pdde_graph_free(g), pdde_context_free(ctx);
    return last < 0.5f * first ? 0 : 1;
}
CPP
} >"$tmp/prog.cpp"

# the libraries after libpdde.a (written by make beside this script)
mapfile -t flags <"$0.flags"
# shellcheck disable=SC2086 # (the libraries, words apart)
"$cxx" -std=c++17 -O1 -Wall -Wextra -Wpedantic -Werror -I. "$tmp/prog.cpp" -o "$tmp/prog" "$build/libpdde.a" ${flags[1]} >"$tmp/cxx.log" 2>&1
rc=$?
check "pdde.h and pdde_extension.h compile as C++17, warning-free, and the program links ($(grep -m3 -E 'error|warning' "$tmp/cxx.log"))" $rc
if [ $rc = 0 ]; then
    out=$("$tmp/prog" 2>&1); rc=$?
    check "the C++ program trains: the loss halves ($out)" $rc
fi
finish
