#!/usr/bin/python3
"""Write tests/data/hf_*: tiny models as Hugging Face saves them (config.json and safetensors) and
PyTorch's logits and loss on them.

Run with the Debian python that has torch (bash tools/install-deps.sh --torch):

    /usr/bin/python3 tools/gen_hf_golden.py

The tests only read the files; they never need torch. Each model is computed here the way Hugging
Face's modeling code computes it (GPT2LMHeadModel, LlamaForCausalLM), independently of pdde's layout:

  hf_gpt2/   GPT-2: Conv1D weights [in, out] used as x @ W + b, c_attn's columns q | k | v; tanh GELU;
             the head tied to wte. Saved as the hub's gpt2 is: F32, names without "transformer.", the
             causal-mask buffers h.N.attn.bias included. V=301, 32 positions, L=2, H=4, C=32.
  hf_llama/  LLaMA: nn.Linear weights [out, in]; RMSNorm in f32, eps 1e-6; RoPE with theta 500000 on
             pairs (i, i + D/2) (rotate_half); grouped-query attention, H=4 query heads over Hkv=2
             (repeat_kv: query head h reads kv head h // 2); SwiGLU down(silu(gate(x)) * up(x)) with 80
             hidden units; an untied lm_head. Saved in BF16 as two shards and
             model.safetensors.index.json. V=256, L=2, C=32; the reference uses the bf16 values.
  hf_llama3/ LLaMA 3.1's rope_scaling ("llama3": factor 8, low_freq_factor 1, high_freq_factor 4,
             original_max_position_embeddings 64, theta 10000: of the 4 frequencies of D=8 one is kept,
             one blended, two slowed 8 times), one kv head for H=4, the head tied to the embedding, eps
             1e-5. Saved in F16, one file. V=256, L=2, C=32; the reference uses the f16 values.
  hf_qwen2/  Qwen2 (Qwen2ForCausalLM): LLaMA's layers with biases on q, k and v (F.linear(x, W, b)), theta
             1e6, eps 1e-6, 2 kv heads of 4, the head tied; a sliding_window of 8, shorter than the
             context, that use_sliding_window false leaves unused. BF16, one file. V=256, L=2, C=32.
  hf_qwen3/  Qwen3 (Qwen3ForCausalLM): LLaMA's layers without biases, heads of head_dim 16 (q is 4 x 16 = 64
             wide for C=32, o_proj [32, 64]), q_norm and k_norm: an RMSNorm of each head of q and of k before
             RoPE; 2 kv heads of 4, theta 1e6, eps 1e-6, an untied lm_head. BF16, one file. V=256, L=2.

Beside hf_gpt2 and hf_llama, a tokenizer.json of each kind (their vocabularies made up, the format
Hugging Face's): byte-level BPE (GPT-2's bytes_to_unicode, decoder "ByteLevel", 301 tokens, the last
"<|endoftext|>" added) and SentencePiece's BPE with byte fallback (U+2581 for a space, "<0x0A>" for a
byte, 256 tokens, "<unk>", "<s>", "</s>" added). Ids 256, 257, 258, 259, 300 of the first decode to
" the", " cat", " café", "\n\n", "<|endoftext|>"; ids 99, 100, 101, 3, 2 of the second to " the", " cat",
" café", "\n", "</s>".

hf_ref.bin (little-endian), for gpt2, llama, llama3, qwen2, then qwen3:
  char magic[8] = "HFREF001"
  per model: i32 B, T, V; i32 ids[B*T], targets[B*T]; f32 loss; f32 logits[B*T*V]
"""
import json
import math
import os
import struct

import torch
import torch.nn.functional as F

B, T, L, C = 2, 16, 2, 32
SEED = 11
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(REPO, "tests", "data")


TORCH_DTYPE = {"BF16": torch.bfloat16, "F16": torch.float16}


def write_safetensors(path, tensors, dtype):
    """tensors: [(name, float tensor)], written in `dtype` ("F32", "BF16" or "F16") in that order."""
    header, blobs, at = {"__metadata__": {"format": "pt"}}, [], 0
    for name, t in tensors:
        if dtype == "F32":
            blob = t.contiguous().numpy().astype("<f4").tobytes()
        else:
            blob = t.to(TORCH_DTYPE[dtype]).contiguous().view(torch.int16).numpy().astype("<i2").tobytes()
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [at, at + len(blob)]}
        blobs.append(blob)
        at += len(blob)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    print("wrote %s (%d bytes)" % (path, os.path.getsize(path)))


def gpt2():
    V, P, H = 301, 32, 4
    g = torch.Generator().manual_seed(SEED)

    def normal(*shape, std=0.02):
        return torch.randn(*shape, generator=g) * std

    W = {"wte.weight": normal(V, C), "wpe.weight": normal(P, C)}
    for l in range(L):
        p = "h.%d." % l
        W.update({p + "ln_1.weight": 1 + normal(C), p + "ln_1.bias": normal(C),
                  p + "attn.c_attn.weight": normal(C, 3 * C), p + "attn.c_attn.bias": normal(3 * C),
                  p + "attn.c_proj.weight": normal(C, C), p + "attn.c_proj.bias": normal(C),
                  p + "ln_2.weight": 1 + normal(C), p + "ln_2.bias": normal(C),
                  p + "mlp.c_fc.weight": normal(C, 4 * C), p + "mlp.c_fc.bias": normal(4 * C),
                  p + "mlp.c_proj.weight": normal(4 * C, C), p + "mlp.c_proj.bias": normal(C)})
    W.update({"ln_f.weight": 1 + normal(C), "ln_f.bias": normal(C)})
    config = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": V, "n_positions": P, "n_ctx": P,
              "n_embd": C, "n_layer": L, "n_head": H, "n_inner": None, "activation_function": "gelu_new",
              "layer_norm_epsilon": 1e-5, "resid_pdrop": 0.1, "torch_dtype": "float32"}

    def forward(ids):
        D = C // H
        x = W["wte.weight"][ids] + W["wpe.weight"][:T]
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
        for l in range(L):
            p = "h.%d." % l
            a = F.layer_norm(x, (C,), W[p + "ln_1.weight"], W[p + "ln_1.bias"], eps=1e-5)
            q, k, v = (a @ W[p + "attn.c_attn.weight"] + W[p + "attn.c_attn.bias"]).split(C, dim=-1)
            q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in (q, k, v))
            att = torch.softmax(((q @ k.transpose(-2, -1)) / math.sqrt(D)).masked_fill(mask, float("-inf")), dim=-1)
            y = (att @ v).transpose(1, 2).reshape(B, T, C)
            x = x + y @ W[p + "attn.c_proj.weight"] + W[p + "attn.c_proj.bias"]
            m = F.layer_norm(x, (C,), W[p + "ln_2.weight"], W[p + "ln_2.bias"], eps=1e-5)
            h = F.gelu(m @ W[p + "mlp.c_fc.weight"] + W[p + "mlp.c_fc.bias"], approximate="tanh")
            x = x + h @ W[p + "mlp.c_proj.weight"] + W[p + "mlp.c_proj.bias"]
        x = F.layer_norm(x, (C,), W["ln_f.weight"], W["ln_f.bias"], eps=1e-5)
        return x @ W["wte.weight"].t()

    # the hub's file: the causal masks beside the weights, as older transformers saved them
    tensors = []
    for name, t in W.items():
        tensors.append((name, t))
        if name.endswith("attn.c_attn.bias"):
            tensors.append((name.replace("c_attn.bias", "bias"), torch.tril(torch.ones(P, P)).view(1, 1, P, P)))
    d = os.path.join(OUT, "hf_gpt2")
    os.makedirs(d, exist_ok=True)
    write_safetensors(os.path.join(d, "model.safetensors"), tensors, "F32")
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    return V, forward


def llama3_inv_freq(inv_freq, factor, low, high, original):
    """transformers' "llama3" rope_scaling, in float32"""
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > original / low, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < original / high) * ~(wavelen > original / low)
    return torch.where(medium, smoothed, scaled)


def llama(name, V, H, HKV, FF, THETA, EPS, tied, scaling, dtype, shards, seed, qkv_bias=False, head_dim=None):
    D, R = head_dim or C // H, H // HKV
    qk_norm = head_dim is not None  # (Qwen3's)
    g = torch.Generator().manual_seed(seed)
    as_file = TORCH_DTYPE[dtype]

    def normal(*shape, std=0.02):
        return torch.randn(*shape, generator=g) * std

    W = {"model.embed_tokens.weight": normal(V, C)}
    for l in range(L):
        p = "model.layers.%d." % l
        W.update({p + "input_layernorm.weight": 1 + normal(C),
                  p + "self_attn.q_proj.weight": normal(H * D, C), p + "self_attn.k_proj.weight": normal(HKV * D, C),
                  p + "self_attn.v_proj.weight": normal(HKV * D, C), p + "self_attn.o_proj.weight": normal(C, H * D),
                  p + "post_attention_layernorm.weight": 1 + normal(C),
                  p + "mlp.gate_proj.weight": normal(FF, C), p + "mlp.up_proj.weight": normal(FF, C),
                  p + "mlp.down_proj.weight": normal(C, FF)})
        if qkv_bias:  # (Qwen2's)
            W.update({p + "self_attn.q_proj.bias": normal(H * D, std=0.5), p + "self_attn.k_proj.bias": normal(HKV * D, std=0.5),
                      p + "self_attn.v_proj.bias": normal(HKV * D, std=0.5)})
        if qk_norm:
            W.update({p + "self_attn.q_norm.weight": 1 + normal(D, std=0.3), p + "self_attn.k_norm.weight": 1 + normal(D, std=0.3)})
    W["model.norm.weight"] = 1 + normal(C)
    if not tied:
        W["lm_head.weight"] = normal(V, C)
    W = {k: v.to(as_file).float() for k, v in W.items()}  # the values the file holds
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": V, "hidden_size": C,
              "intermediate_size": FF, "num_hidden_layers": L, "num_attention_heads": H, "num_key_value_heads": HKV,
              "max_position_embeddings": 128, "rms_norm_eps": EPS, "rope_theta": THETA, "rope_scaling": None,
              "hidden_act": "silu", "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": tied,
              "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16" if dtype == "BF16" else "float16"}
    if scaling:
        config["rope_scaling"] = dict(scaling, rope_type="llama3")
    if qkv_bias:  # Qwen2Config: no attention_bias field (q, k, v always have biases); a window only where use_sliding_window says
        for k in ("attention_bias", "mlp_bias"):
            del config[k]
        config.update({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "use_sliding_window": False, "sliding_window": 8,
                       "max_window_layers": L})
    if qk_norm:  # Qwen3Config: attention_bias (false), no mlp_bias; head_dim its own
        del config["mlp_bias"]
        config.update({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "head_dim": D, "use_sliding_window": False,
                       "sliding_window": None, "max_window_layers": L})

    def rms(x, w):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS))

    def rotate_half(x):
        return torch.cat((-x[..., D // 2:], x[..., :D // 2]), dim=-1)

    def forward(ids):
        inv_freq = 1.0 / (THETA ** (torch.arange(0, D, 2, dtype=torch.int64).float() / D))
        if scaling:
            inv_freq = llama3_inv_freq(inv_freq, scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"],
                                       scaling["original_max_position_embeddings"])
        freqs = torch.arange(T).float()[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        x = W["model.embed_tokens.weight"][ids]
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
        for l in range(L):
            p = "model.layers.%d." % l
            a = rms(x, W[p + "input_layernorm.weight"])
            q = F.linear(a, W[p + "self_attn.q_proj.weight"], W.get(p + "self_attn.q_proj.bias")).view(B, T, H, D)
            k = F.linear(a, W[p + "self_attn.k_proj.weight"], W.get(p + "self_attn.k_proj.bias")).view(B, T, HKV, D)
            if qk_norm:  # Qwen3Attention: q_norm and k_norm over each head, before RoPE
                q, k = rms(q, W[p + "self_attn.q_norm.weight"]), rms(k, W[p + "self_attn.k_norm.weight"])
            q, k = q.transpose(1, 2), k.transpose(1, 2)
            v = F.linear(a, W[p + "self_attn.v_proj.weight"], W.get(p + "self_attn.v_proj.bias")).view(B, T, HKV, D).transpose(1, 2)
            q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
            k = k[:, :, None].expand(B, HKV, R, T, D).reshape(B, H, T, D)  # repeat_kv
            v = v[:, :, None].expand(B, HKV, R, T, D).reshape(B, H, T, D)
            att = torch.softmax(((q @ k.transpose(-2, -1)) / math.sqrt(D)).masked_fill(mask, float("-inf")), dim=-1)
            y = (att @ v).transpose(1, 2).reshape(B, T, H * D)
            x = x + F.linear(y, W[p + "self_attn.o_proj.weight"])
            m = rms(x, W[p + "post_attention_layernorm.weight"])
            h = F.silu(F.linear(m, W[p + "mlp.gate_proj.weight"])) * F.linear(m, W[p + "mlp.up_proj.weight"])
            x = x + F.linear(h, W[p + "mlp.down_proj.weight"])
        head = W["model.embed_tokens.weight"] if tied else W["lm_head.weight"]
        return F.linear(rms(x, W["model.norm.weight"]), head)

    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    names = list(W)
    if shards == 1:
        write_safetensors(os.path.join(d, "model.safetensors"), [(n, W[n]) for n in names], dtype)
    else:
        half = len(names) // 2
        weight_map = {}
        for i, part in enumerate((names[:half], names[half:])):
            file = "model-%05d-of-%05d.safetensors" % (i + 1, 2)
            write_safetensors(os.path.join(d, file), [(n, W[n]) for n in part], dtype)
            weight_map.update({n: file for n in part})
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": sum(2 * t.numel() for t in W.values())}, "weight_map": weight_map}, f, indent=2)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    return V, forward


def llama2():
    return llama("hf_llama", 256, 4, 2, 80, 500000.0, 1e-6, False, None, "BF16", 2, SEED + 1)


def llama3():
    scaling = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    return llama("hf_llama3", 256, 4, 1, 64, 10000.0, 1e-5, True, scaling, "F16", 1, SEED + 2)


def qwen2():
    return llama("hf_qwen2", 256, 4, 2, 72, 1000000.0, 1e-6, True, None, "BF16", 1, SEED + 3, qkv_bias=True)


def qwen3():
    return llama("hf_qwen3", 256, 4, 2, 64, 1000000.0, 1e-6, False, None, "BF16", 1, SEED + 4, head_dim=16)


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}, bs


def write_tokenizers():
    to_char, order = bytes_to_unicode()
    spell = lambda text: "".join(to_char[b] for b in text.encode())
    vocab = {to_char[b]: i for i, b in enumerate(order)}  # GPT-2's ids 0..255, in bytes_to_unicode's order
    for word in (" the", " cat", " café", "\n\n"):  # ids 256..259
        vocab[spell(word)] = len(vocab)
    while len(vocab) < 300:
        vocab[spell(" w%d" % len(vocab))] = len(vocab)
    vocab["<|endoftext|>"] = 300
    byte_level = {"version": "1.0", "added_tokens": [{"id": 300, "content": "<|endoftext|>", "special": True}],
                  "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False}, "decoder": {"type": "ByteLevel"},
                  "model": {"type": "BPE", "vocab": vocab, "merges": []}}
    with open(os.path.join(OUT, "hf_gpt2", "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(byte_level, f, ensure_ascii=False, indent=1)
    specials = ["<unk>", "<s>", "</s>"]
    vocab = {t: i for i, t in enumerate(specials)}
    for b in [0x0A] + list(range(0x20, 0x7F)):
        vocab["<0x%02X>" % b] = len(vocab)
    for word in ("▁the", "▁cat", "▁café", "▁sat"):
        vocab[word] = len(vocab)
    while len(vocab) < 256:
        vocab["▁w%d" % len(vocab)] = len(vocab)
    piece = {"version": "1.0", "added_tokens": [{"id": i, "content": t, "special": True} for i, t in enumerate(specials)],
             "decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                                                          {"type": "ByteFallback"}, {"type": "Fuse"},
                                                          {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
             "model": {"type": "BPE", "vocab": vocab, "merges": [], "byte_fallback": True}}
    with open(os.path.join(OUT, "hf_llama", "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(piece, f, ensure_ascii=False, indent=1)


def main():
    torch.set_num_threads(1)
    ref = open(os.path.join(OUT, "hf_ref.bin"), "wb")
    ref.write(b"HFREF001")
    for k, build in enumerate((gpt2, llama2, llama3, qwen2, qwen3)):
        V, forward = build()
        g = torch.Generator().manual_seed(SEED + 10 + k)
        ids = torch.randint(0, V, (B, T), generator=g)
        targets = torch.randint(0, V, (B, T), generator=g)
        logits = forward(ids)
        loss = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1)).item()
        ref.write(struct.pack("<3i", B, T, V))
        ref.write(struct.pack("<%di" % (B * T), *ids.reshape(-1).tolist()))
        ref.write(struct.pack("<%di" % (B * T), *targets.reshape(-1).tolist()))
        ref.write(struct.pack("<f", loss))
        ref.write(logits.detach().reshape(-1).numpy().astype("<f4").tobytes())
        print("%s: loss %.6f" % (build.__name__, loss))
    ref.close()
    write_tokenizers()
    print("wrote %s" % os.path.join(OUT, "hf_ref.bin"))


if __name__ == "__main__":
    main()
