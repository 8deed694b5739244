#!/usr/bin/python3
"""PyTorch baseline for pdde's GPT training benchmark (CPU, float32; --dtype bf16: autocast; --device cuda).

Trains the same GPT-2-style model as tools/gen_golden.py (pre-LN blocks, tanh GELU, causal
attention, weight-tied output, weights [in, out] used as x @ W, AdamW lr=1e-3 with weight decay 0.1
on parameters with ndim >= 2) on one fixed random batch, and times the training step:
forward + cross-entropy + backward + AdamW step + zero_grad(set_to_none=True).
--arch llama: the LLaMA-style model of examples/gpt.h instead (RMSNorm, rotate-half RoPE, grouped-query
attention over --kv-heads with qkv columns [Hkv, H/Hkv + 2, D], SwiGLU of gpt_ffn's hidden units, no
biases, no position embedding, tied head).

    OPENBLAS_NUM_THREADS=2 OMP_NUM_THREADS=2 /usr/bin/python3 tools/bench/gpt_torch.py \
        --vocab 256 --layers 4 --heads 4 --width 128 --ctx 64 --batch 8 --steps 10 --warmup 2 --threads 2

On a GPU (tools/gpu-check.sh) as PyTorch users train: --device cuda --dtype bf16 --sdpa (causal
scaled_dot_product_attention, AdamW fused), --compile (torch.compile of the forward and loss); in f32
TF32 is off (as pdde's cuBLAS GEMMs without PDDE_CUDA_TF32).

Prints exactly one final line:
    TORCH tokens_per_s=<B*T/median step s> step_ms=<median step ms> cpu_ms=<median CPU time per step> peak_mb=<MB>
Unless the caller sets it, OMP_WAIT_POLICY defaults to PASSIVE (see main()).
peak_mb is ru_maxrss after the timed steps minus ru_maxrss right after `import torch` (MB = KiB/1024).
"""
import argparse
import math
import os
import resource
import statistics
import sys
import time


def parse_args():
    ap = argparse.ArgumentParser(description="PyTorch GPT training-step benchmark")
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--ctx", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10, help="timed steps")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps before timing")
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "1") or 1))
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--dtype", choices=("f32", "bf16"), default="f32",
                    help="bf16: the forward under torch.autocast(device, bfloat16) (mixed precision)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--sdpa", action="store_true", help="attention by F.scaled_dot_product_attention(is_causal=True)")
    ap.add_argument("--compile", action="store_true", help="torch.compile the forward and loss")
    ap.add_argument("--arch", choices=("gpt", "llama"), default="gpt")
    ap.add_argument("--kv-heads", type=int, default=0, help="llama: key/value heads (0 = --heads)")
    ap.add_argument("--rope-base", type=float, default=10000.0)
    ap.add_argument("--doc-every", type=int, default=0,
                    help="documents of N tokens packed in each row, attention inside each, GPT's positions restarting")
    a = ap.parse_args()
    if a.arch == "llama" and (a.heads % (a.kv_heads or a.heads) or (a.width // a.heads) % 2):
        ap.error("--kv-heads must divide --heads and the head dim must be even")
    if a.width % a.heads:
        ap.error("--width must be divisible by --heads")
    if min(a.vocab, a.layers, a.heads, a.width, a.ctx, a.batch, a.steps, a.threads) < 1 or a.warmup < 0:
        ap.error("sizes, --steps and --threads must be >= 1, --warmup >= 0")
    return a


def main():
    a = parse_args()
    # The caller normally sets these; default them to --threads so BLAS/OpenMP agree with torch.
    os.environ.setdefault("OMP_NUM_THREADS", str(a.threads))
    os.environ.setdefault("OPENBLAS_NUM_THREADS", str(a.threads))
    # torch's OpenMP threads spin-wait between parallel regions by default; on a small machine they
    # then fight OpenBLAS's own threads for the cores (measured on 2 cores, OPENBLAS=OMP=2: median
    # step 2-3x slower and very noisy). Passive waiting avoids that; a caller's setting wins.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

    import torch
    import torch.nn.functional as F

    rss_base_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    dev = torch.device(a.device)
    cuda = a.device == "cuda"
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    V, L, H, C, T, B = a.vocab, a.layers, a.heads, a.width, a.ctx, a.batch
    D = C // H
    proj_std = 0.02 / math.sqrt(2 * L)

    def normal(shape, std):
        return torch.empty(shape, device=dev).normal_(0.0, std).requires_grad_(True)

    def const(shape, v):
        return torch.full(shape, float(v), device=dev).requires_grad_(True)

    llama = a.arch == "llama"
    Hkv = a.kv_heads or H
    R = H // Hkv
    mult = 256 if C >= 1024 else 32
    Fh = -(-(8 * C // 3) // mult) * mult if llama else 4 * C  # the MLP's hidden units (examples/gpt.h's gpt_ffn)
    wte, wpe = normal((V, C), 0.02), normal((T, C), 0.02)
    blocks = []
    for _ in range(L if llama else 0):
        blocks.append({
            "ln1.g": const((C,), 1), "attn.w": normal((C, (H + 2 * Hkv) * D), 0.02), "proj.w": normal((C, C), proj_std),
            "ln2.g": const((C,), 1), "fc.w": normal((C, Fh), 0.02), "fc3.w": normal((C, Fh), 0.02), "fcproj.w": normal((Fh, C), proj_std),
        })
    for _ in range(0 if llama else L):
        blocks.append({
            "ln1.g": const((C,), 1), "ln1.b": const((C,), 0),
            "attn.w": normal((C, 3 * C), 0.02), "attn.b": const((3 * C,), 0),
            "proj.w": normal((C, C), proj_std), "proj.b": const((C,), 0),
            "ln2.g": const((C,), 1), "ln2.b": const((C,), 0),
            "fc.w": normal((C, 4 * C), 0.02), "fc.b": const((4 * C,), 0),
            "fcproj.w": normal((4 * C, C), proj_std), "fcproj.b": const((C,), 0),
        })
    lnf_g, lnf_b = const((C,), 1), const((C,), 0)
    params = ([wte] if llama else [wte, wpe]) + [p for blk in blocks for p in blk.values()] + ([lnf_g] if llama else [lnf_g, lnf_b])
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.999), eps=1e-8, **({"fused": True} if cuda else {}))

    ids = torch.randint(0, V, (B, T)).to(dev)
    targets = torch.randint(0, V, (B, T)).to(dev)
    pos = torch.arange(T, device=dev)
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool, device=dev), diagonal=1)  # j > i
    scale = 1.0 / math.sqrt(D)
    doc = None  # --doc-every: True where query i may see key j (j <= i, the same document)
    if a.doc_every:
        doc = (~mask) & ((pos[:, None] // a.doc_every) == (pos[None, :] // a.doc_every))
        mask, pos = ~doc, pos % a.doc_every

    def attend(q, k, v):
        if a.sdpa:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=doc) if doc is not None else F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return torch.softmax(((q @ k.transpose(-2, -1)) * scale).masked_fill(mask, float("-inf")), dim=-1) @ v

    # RoPE (rotate half): angle t / base^(2i/D) for pair (i, i + D/2), as pdde_rope
    inv_freq = 1.0 / (a.rope_base ** (torch.arange(0, D, 2, device=dev).float() / D))
    ang = torch.outer(pos.float(), inv_freq)
    cos, sin = torch.cat([ang.cos()] * 2, -1)[None, :, None, :], torch.cat([ang.sin()] * 2, -1)[None, :, None, :]

    def rope(t):  # [B, T, h, D]
        t1, t2 = t[..., :D // 2], t[..., D // 2:]
        return t * cos + torch.cat([-t2, t1], -1) * sin

    def rmsnorm(x, g):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * g

    def forward_llama():
        x = wte[ids]
        for p in blocks:
            qkv = (rmsnorm(x, p["ln1.g"]) @ p["attn.w"]).reshape(B, T, Hkv, R + 2, D)
            q = rope(qkv[:, :, :, :R].reshape(B, T, H, D))
            k = rope(qkv[:, :, :, R]).repeat_interleave(R, dim=2)  # query head g R + r reads group g's k, v
            v = qkv[:, :, :, R + 1].repeat_interleave(R, dim=2)
            q, k, v = (t.permute(0, 2, 1, 3) for t in (q, k, v))
            y = attend(q, k, v)
            x = x + y.permute(0, 2, 1, 3).reshape(B, T, C) @ p["proj.w"]
            h = rmsnorm(x, p["ln2.g"])
            x = x + (F.silu(h @ p["fc.w"]) * (h @ p["fc3.w"])) @ p["fcproj.w"]
        logits = rmsnorm(x, lnf_g).reshape(B * T, C) @ wte.t()
        return F.cross_entropy(logits, targets.reshape(-1))

    def forward():
        if llama:
            return forward_llama()
        x = wte[ids] + wpe[pos]
        for p in blocks:
            a_ = F.layer_norm(x, (C,), p["ln1.g"], p["ln1.b"], 1e-5)
            qkv = torch.addmm(p["attn.b"], a_.reshape(B * T, C), p["attn.w"]).reshape(B, T, 3 * C)
            # head-major columns [H, 3, D], as examples/gpt.h
            q, k, v = (t.permute(0, 2, 1, 3) for t in qkv.reshape(B, T, H, 3, D).unbind(dim=3))
            y = attend(q, k, v).permute(0, 2, 1, 3).reshape(B * T, C)
            x = x + torch.addmm(p["proj.b"], y, p["proj.w"]).reshape(B, T, C)
            m = F.layer_norm(x, (C,), p["ln2.g"], p["ln2.b"], 1e-5).reshape(B * T, C)
            u = F.gelu(torch.addmm(p["fc.b"], m, p["fc.w"]), approximate="tanh")
            x = x + torch.addmm(p["fcproj.b"], u, p["fcproj.w"]).reshape(B, T, C)
        x = F.layer_norm(x, (C,), lnf_g, lnf_b, 1e-5)
        logits = x.reshape(B * T, C) @ wte.t()
        return F.cross_entropy(logits, targets.reshape(-1))

    fwd = torch.compile(forward) if a.compile else forward

    def step():
        with torch.autocast(a.device, dtype=torch.bfloat16, enabled=a.dtype == "bf16"):
            loss = fwd()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
        return loss

    n_params = sum(p.numel() for p in params)
    print("torch %s, %d threads (OMP_NUM_THREADS=%s OPENBLAS_NUM_THREADS=%s OMP_WAIT_POLICY=%s); V=%d L=%d H=%d C=%d T=%d B=%d; %d params (%.1fM)"
          % (torch.__version__, torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS"),
             os.environ.get("OPENBLAS_NUM_THREADS"), os.environ.get("OMP_WAIT_POLICY"), V, L, H, C, T, B, n_params, n_params / 1e6),
          file=sys.stderr)

    for i in range(a.warmup):
        t0 = time.perf_counter()
        loss = step()
        print("warmup %d: %.1f ms loss %.4f" % (i, (time.perf_counter() - t0) * 1e3, loss.item()),
              file=sys.stderr)
    times, cpu = [], []
    for i in range(a.steps):
        t0, c0 = time.perf_counter(), time.process_time()
        loss = step()
        dt = time.perf_counter() - t0
        times.append(dt)
        cpu.append(time.process_time() - c0)
        print("step %d: %.1f ms loss %.4f" % (i, dt * 1e3, loss.item()), file=sys.stderr)

    rss_peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    med = statistics.median(times)
    peak_mb = (rss_peak_kib - rss_base_kib) / 1024.0
    print("TORCH tokens_per_s=%.1f step_ms=%.2f cpu_ms=%.2f peak_mb=%.1f"
          % (B * T / med, med * 1e3, statistics.median(cpu) * 1e3, peak_mb))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
