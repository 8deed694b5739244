#!/usr/bin/env python3
"""torch.matmul on the GEMM shapes of a GPT step, the peer of `bench_cuda --gemm` (which runs this script and
reads its TORCH lines): bf16 operands and output, the same transposes (views of row-major tensors, as
pdde's operands are), random inputs, copies rotated where a shape's operands are small against the L2
cache; CUDA events around 10 calls, the median of 11 such runs. Forward shapes with a bias are also timed
as torch.nn.functional.linear with a bias (addmm: cublasLt's bias epilogue), as bias_ms.

  gemm_torch.py [--shapes name:M:N:K:ta:tb:count:bias,...]     (default: GPT-2 124M, B 8, T 1024)

Prints one "TORCH shape=NAME m=.. n=.. k=.. ms=.. tflops=.. [bias_ms=..]" line a shape, then
"TORCH total ms=.. tflops=.." (each shape weighted by its calls a step), or "TORCH none: why" and exits 0
where torch or CUDA is missing."""
import sys


def gpt2_shapes(B=8, T=1024, C=768, V=50304, L=12):
    M, out = B * T, []
    for name, i, o in (("qkv", C, 3 * C), ("proj", C, C), ("fc", C, 4 * C), ("fcproj", 4 * C, C)):
        out += [(name + "_fwd", M, o, i, 0, 0, L, 1), (name + "_dx", M, i, o, 0, 1, L, 0), (name + "_dw", i, o, M, 1, 0, L, 0)]
    return out + [("head_fwd", M, V, C, 0, 1, 1, 0), ("head_dx", M, C, V, 0, 0, 1, 0), ("head_dw", V, C, M, 1, 0, 1, 0)]


def parse(argv):
    if "--shapes" not in argv:
        return gpt2_shapes()
    spec = argv[argv.index("--shapes") + 1]
    return [(f[0], *map(int, f[1:])) for f in (s.split(":") for s in spec.split(","))]


def main():
    shapes = parse(sys.argv[1:])
    try:
        import torch
    except ImportError:
        print("TORCH none: no torch module")
        return 0
    if not torch.cuda.is_available():
        print("TORCH none: torch has no CUDA device")
        return 0
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False  # (f32 accumulation, as pdde)
    dev, dt = "cuda", torch.bfloat16
    total_ms = total_flops = 0.0
    g = torch.Generator(device=dev).manual_seed(1)

    def timed(fn, sets):
        for k in range(3):
            fn(k % sets)
        torch.cuda.synchronize()
        e0, e1, t, k = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True), [], 0
        for _ in range(11):
            e0.record()
            for _ in range(10):
                fn(k % sets)
                k += 1
            e1.record()
            e1.synchronize()
            t.append(e0.elapsed_time(e1) / 10)
        return sorted(t)[5]

    for name, M, N, K, ta, tb, count, bias in shapes:
        set_bytes = 2 * (M * K + K * N + M * N)
        sets = max(1, min(8, (256 << 20) // set_bytes)) if set_bytes < (128 << 20) else 1
        # row-major storage as pdde's: A is [K, M] when ta (used as its transpose), B [N, K] when tb
        A = [torch.rand((K, M) if ta else (M, K), generator=g, device=dev).mul_(2).sub_(1).to(dt) for _ in range(sets)]
        Bm = [torch.rand((N, K) if tb else (K, N), generator=g, device=dev).mul_(2).sub_(1).to(dt) for _ in range(sets)]
        a = [x.t() if ta else x for x in A]
        b = [x.t() if tb else x for x in Bm]
        out = [torch.empty((M, N), device=dev, dtype=dt) for _ in range(sets)]
        ms = timed(lambda i: torch.matmul(a[i], b[i], out=out[i]), sets)
        flops = 2.0 * M * N * K
        line = f"TORCH shape={name} m={M} n={N} k={K} ta={ta} tb={tb} count={count} ms={ms:.4f} tflops={flops / ms / 1e9:.1f}"
        if bias:  # F.linear(x, W^T, b): W stored [N, K] as torch's linear weight
            w = [x.t().contiguous() for x in b]
            bv = torch.rand(N, generator=g, device=dev).to(dt)
            bms = timed(lambda i: torch.nn.functional.linear(a[i], w[i], bv), sets)
            line += f" bias_ms={bms:.4f}"
        print(line, flush=True)
        total_ms += ms * count
        total_flops += flops * count
        del A, Bm, a, b, out
        torch.cuda.empty_cache()
    print(f"TORCH total ms={total_ms:.3f} tflops={total_flops / total_ms / 1e9:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
