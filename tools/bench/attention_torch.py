#!/usr/bin/python3
"""PyTorch's causal attention forward and backward, as tools/bench/bench_cuda.c --attention times pdde's:
f32 leaves q, k, v [B, H, T, D] under torch.autocast(bfloat16), y = scaled_dot_product_attention(q, k, v,
is_causal=True), loss = sum(y * w), backward; the median of --reps timed runs after --warmup, each
synchronised. --packed: one f32 leaf qkv [B, T, H*3*D] (bench_cuda --attention --packed's layout) viewed
as q, k, v [B, H, T, D] and y back to [B, T, H*D], as a GPT block's attention takes them. --doc-every N:
documents of N tokens kept apart, SDPA given the block-diagonal causal mask (bench_cuda --doc-every N). Prints
one final line:
    TORCH_ATTENTION B=.. H=.. T=.. D=.. dtype=.. [layout=packed] [doc_every=N] fwd_bwd_ms=<median ms> backend=<the SDPA kernels enabled>
"""
import argparse
import statistics
import sys
import time


def main():
    ap = argparse.ArgumentParser(description="PyTorch SDPA forward + backward timing")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--dtype", choices=("f32", "bf16"), default="bf16")
    ap.add_argument("--packed", action="store_true")
    ap.add_argument("--doc-every", type=int, default=0)
    a = ap.parse_args()
    import torch
    import torch.nn.functional as F
    if not torch.cuda.is_available():
        print("TORCH_ATTENTION no CUDA device")
        return 0
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    B, H, T, D = a.batch, a.heads, a.ctx, a.head_dim
    shape = (B, H, T, D)
    leaves = [torch.randn((B, T, H * 3 * D), device=dev).requires_grad_(True)] if a.packed else \
        [torch.randn(shape, device=dev).requires_grad_(True) for _ in range(3)]
    w = torch.randn((B, T, H * D) if a.packed else shape, device=dev)
    mask = None  # (True: attend) query t sees keys of its document at or before it
    if a.doc_every > 0:
        t = torch.arange(T, device=dev)
        mask = (t[None, :] <= t[:, None]) & (t[None, :] // a.doc_every == t[:, None] // a.doc_every)
    att = dict(attn_mask=mask) if mask is not None else dict(is_causal=True)

    def run():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=a.dtype == "bf16"):
            if a.packed:
                q, k, v = (t.squeeze(3).transpose(1, 2) for t in leaves[0].view(B, T, H, 3, D).split(1, dim=3))
                y = F.scaled_dot_product_attention(q, k, v, **att).transpose(1, 2).reshape(B, T, H * D)
            else:
                y = F.scaled_dot_product_attention(*leaves, **att)
        loss = (y.float() * w).sum()
        loss.backward()
        for t in leaves:
            t.grad = None

    for _ in range(a.warmup):
        run()
    torch.cuda.synchronize()
    times = []
    for _ in range(a.reps):
        t0 = time.perf_counter()
        run()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    kinds = [n for n, on in (("flash", torch.backends.cuda.flash_sdp_enabled()),
                             ("mem_efficient", torch.backends.cuda.mem_efficient_sdp_enabled()),
                             ("cudnn", torch.backends.cuda.cudnn_sdp_enabled())) if on]
    print("TORCH_ATTENTION B=%d H=%d T=%d D=%d dtype=%s%s%s fwd_bwd_ms=%.3f backend=%s"
          % (B, H, T, D, a.dtype, " layout=packed" if a.packed else "", " doc_every=%d" % a.doc_every if a.doc_every > 0 else "",
             statistics.median(times) * 1e3, "+".join(kinds) or "math"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
