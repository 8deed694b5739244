#!/usr/bin/env python3
"""torch.matmul on the GEMM shapes of a GPT step, the peer of `bench_cuda --gemm` (which runs this script and
reads its TORCH lines): bf16 operands and output, the same transposes (views of row-major tensors, as
pdde's operands are), random inputs, copies rotated where a shape's operands are small against the L2
cache; CUDA events around 10 calls, the median of 11 such runs. The peers of pdde's other paths, where this
torch has them: forward shapes with a bias as torch.nn.functional.linear with a bias (addmm: cublasLt's bias
epilogue, bf16 out), bias_ms; act 1 (a GELU follows) as torch._addmm_activation(use_gelu) (cublasLt's
GELU_BIAS), else linear then gelu (tanh), gelu_ms; act 2 (gelu' follows) as the matmul then gelu_backward,
dgelu_ms; every shape into f32 (torch.mm with out_dtype, torch 2.8+), f32_ms; weight gradients (kind 2)
accumulated into an f32 matrix (torch.addmm with out_dtype), acc_ms; forward shapes without the bias in torch's
own layout (F.linear: the weight [out, in], where pdde keeps [in, out]), linear_ms.

  gemm_torch.py [--shapes name:M:N:K:ta:tb:count:bias[:act:kind],...]     (default: GPT-2 124M, B 8, T 1024)

Prints one "TORCH shape=NAME m=.. n=.. k=.. ms=.. tflops=.. [bias_ms=..] [gelu_ms=..] ..." line a shape, then
"TORCH total ms=.. tflops=.." (each shape weighted by its calls a step), or "TORCH none: why" and exits 0
where torch or CUDA is missing."""
import sys


def gpt2_shapes(B=8, T=1024, C=768, V=50304, L=12):
    M, out = B * T, []
    for name, i, o in (("qkv", C, 3 * C), ("proj", C, C), ("fc", C, 4 * C), ("fcproj", 4 * C, C)):
        out += [(name + "_fwd", M, o, i, 0, 0, L, 1, int(name == "fc"), 0), (name + "_dx", M, i, o, 0, 1, L, 0, 2 * (name == "fcproj"), 1),
                (name + "_dw", i, o, M, 1, 0, L, 0, 0, 2)]
    return out + [("head_fwd", M, V, C, 0, 1, 1, 0, 0, 0), ("head_dx", M, C, V, 0, 0, 1, 0, 0, 1), ("head_dw", V, C, M, 1, 0, 1, 0, 0, 2)]


def parse(argv):
    if "--shapes" not in argv:
        return gpt2_shapes()
    spec = argv[argv.index("--shapes") + 1]
    shapes = [(f[0], *map(int, f[1:])) for f in (s.split(":") for s in spec.split(","))]
    return [sh + (0, 0) if len(sh) == 8 else sh for sh in shapes]  # (act, kind: absent in the short form)


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

    noted = set()

    def optional(fn, sets):  # a peer this torch may lack (out_dtype, _addmm_activation): None where it raises (said once)
        try:
            return timed(fn, sets)
        except (TypeError, RuntimeError, AttributeError, NotImplementedError) as e:
            why = (str(e).splitlines() or [type(e).__name__])[0][:120]
            if why not in noted:
                noted.add(why)
                print(f"TORCH note: {why}", flush=True)
            return None

    for name, M, N, K, ta, tb, count, bias, act, kind in shapes:
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
            lms = timed(lambda i: torch.nn.functional.linear(a[i], w[i]), sets)  # (torch's layout, no bias)
            line += f" bias_ms={bms:.4f} linear_ms={lms:.4f}"
            if act == 1:
                gms = optional(lambda i: torch._addmm_activation(bv, a[i], b[i], use_gelu=True), sets)
                if gms is None:
                    gms = timed(lambda i: torch.nn.functional.gelu(torch.nn.functional.linear(a[i], w[i], bv), approximate="tanh"), sets)
                line += f" gelu_ms={gms:.4f}"
        if act == 2:  # dx = (dy W^T) * gelu'(x): the matmul, then gelu_backward
            x = torch.rand((M, N), generator=g, device=dev).mul_(2).sub_(1).to(dt)
            dms = timed(lambda i: torch.ops.aten.gelu_backward(torch.matmul(a[i], b[i], out=out[i]), x, approximate="tanh"), sets)
            line += f" dgelu_ms={dms:.4f}"
            del x
        fms = optional(lambda i: torch.mm(a[i], b[i], out_dtype=torch.float32), sets)
        if fms is not None:
            line += f" f32_ms={fms:.4f}"
        if kind == 2:
            acc = torch.rand((M, N), generator=g, device=dev)
            ams = optional(lambda i: torch.addmm(acc, a[i], b[i], out_dtype=torch.float32), sets)
            if ams is not None:
                line += f" acc_ms={ams:.4f}"
            del acc
        print(line, flush=True)
        total_ms += ms * count
        total_flops += flops * count
        del A, Bm, a, b, out
        torch.cuda.empty_cache()
    print(f"TORCH total ms={total_ms:.3f} tflops={total_flops / total_ms / 1e9:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
