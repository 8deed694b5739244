#!/usr/bin/python3
"""bench-lora's peer: LoRA fine-tuning of a Hugging Face LLaMA directory in PyTorch, as PEFT computes it
(rank-R adapters on every linear of the blocks, A normal with std 1/sqrt(in), B zeros, x A B alpha/R;
the pretrained weights frozen; AdamW lr 3e-3, weight decay 0.1, gradient clipping 1.0), in f32 on the CPU.

    /usr/bin/python3 tools/bench/peer_lora_torch.py DIR RANK B T STEPS THREADS

Prints the first step's loss (the pretrained model's: B is zero) and the median step time:
    peer_lora loss0=<f> step_ms=<f> steps=<n>
"""
import json
import math
import statistics
import struct
import sys
import time

import torch
import torch.nn.functional as F


def load_safetensors(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    dtypes = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        out[name] = torch.frombuffer(bytearray(raw[8 + n + a:8 + n + b]), dtype=dtypes[t["dtype"]]).float().reshape(t["shape"])
    return out


def main():
    d, R, B, T, steps, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    cfg = json.load(open(d + "/config.json"))
    W = load_safetensors(d + "/model.safetensors")
    C, H, HKV, L, V = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["num_hidden_layers"], cfg["vocab_size"]
    D, eps, theta = C // H, cfg["rms_norm_eps"], cfg["rope_theta"]
    head = W["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else W["lm_head.weight"]
    adapters = {}
    for name, w in W.items():
        if ".layers." in name and w.dim() == 2:
            out_f, in_f = w.shape
            adapters[name] = (torch.nn.Parameter(torch.randn(in_f, R) / math.sqrt(in_f)), torch.nn.Parameter(torch.zeros(R, out_f)))
    params = [p for pair in adapters.values() for p in pair]
    opt = torch.optim.AdamW(params, lr=3e-3, weight_decay=0.1)

    def linear(x, name):
        a, b = adapters[name]
        return F.linear(x, W[name]) + (x @ a) @ b  # (alpha = R: a scale of 1)

    def rms(x, w):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    inv = 1.0 / (theta ** (torch.arange(0, D, 2).float() / D))
    emb = torch.cat([torch.arange(T).float()[:, None] * inv[None, :]] * 2, dim=-1)
    cos, sin = emb.cos(), emb.sin()
    rot = lambda x: torch.cat((-x[..., D // 2:], x[..., :D // 2]), dim=-1)

    def loss_of(ids, targets):
        x = W["model.embed_tokens.weight"][ids]
        for l in range(L):
            p = "model.layers.%d." % l
            a = rms(x, W[p + "input_layernorm.weight"])
            q = linear(a, p + "self_attn.q_proj.weight").view(B, T, H, D).transpose(1, 2)
            k = linear(a, p + "self_attn.k_proj.weight").view(B, T, HKV, D).transpose(1, 2)
            v = linear(a, p + "self_attn.v_proj.weight").view(B, T, HKV, D).transpose(1, 2)
            q, k = q * cos + rot(q) * sin, k * cos + rot(k) * sin
            k, v = k.repeat_interleave(H // HKV, dim=1), v.repeat_interleave(H // HKV, dim=1)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True) if hasattr(F, "scaled_dot_product_attention") else \
                torch.softmax((q @ k.transpose(-2, -1) / math.sqrt(D)).masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf")), -1) @ v
            x = x + linear(y.transpose(1, 2).reshape(B, T, C), p + "self_attn.o_proj.weight")
            m = rms(x, W[p + "post_attention_layernorm.weight"])
            x = x + linear(F.silu(linear(m, p + "mlp.gate_proj.weight")) * linear(m, p + "mlp.up_proj.weight"), p + "mlp.down_proj.weight")
        return F.cross_entropy(F.linear(rms(x, W["model.norm.weight"]), head).reshape(-1, V), targets.reshape(-1))

    times, loss0 = [], None
    for step in range(steps):
        ids, targets = torch.randint(0, 256, (B, T)), torch.randint(0, 256, (B, T))
        t0 = time.perf_counter()
        loss = loss_of(ids, targets)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
        loss0 = loss.item() if loss0 is None else loss0
    print("peer_lora loss0=%.4f step_ms=%.1f steps=%d" % (loss0, 1e3 * statistics.median(times[1:] or times), steps))


if __name__ == "__main__":
    main()
