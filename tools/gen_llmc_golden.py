#!/usr/bin/python3
"""Write tests/data/gpt2_llmc*.bin: a tiny GPT-2 in llm.c's model file format and PyTorch's loss on it.

Run with the Debian python that has torch (bash tools/install-deps.sh --torch):

    /usr/bin/python3 tools/gen_llmc_golden.py

The tests only read the files; they never need torch. Files:
  gpt2_llmc.bin       llm.c's GPT-2 model file, version 3 (f32)
  gpt2_llmc_bf16.bin  the same weights rounded to bf16, version 5
  gpt2_llmc_ref.bin   the batch and PyTorch's results on both (format below)

The model is computed here the way llm.c's train_gpt2.py lays it out, independently of pdde's layout:
linear weights [out, in] used as F.linear; the qkv rows are q of every head, then k, then v (each [H, D]);
wte has Vp rows, the last Vp - V zeros (llm.c's padding), and the logits are over the first V only.
GELU is the tanh form, layernorm's eps 1e-5, the head tied to wte.

Config: V=300 (padded to Vp=320), maxT=32, L=2, H=4, C=32; the batch B=2, T=16 (fewer positions than
the file has), torch.manual_seed(7).

gpt2_llmc_ref.bin (little-endian):
  char magic[8] = "LLMCREF1"; i32 B, T, V
  i32 ids[B*T], targets[B*T]
  f32 loss (the f32 file), f32 loss_bf16 (the bf16 file's weights, computed in f32)
  f32 logits[B*T*V] (the f32 file)
"""
import math
import os
import struct

import torch
import torch.nn.functional as F

V, VP, MAXT, L, H, C = 300, 320, 32, 2, 4, 32
B, T = 2, 16
SEED = 7
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(REPO, "tests", "data")


def make_params():
    """llm.c's 16 tensors in file order, each over all layers."""
    g = torch.Generator().manual_seed(SEED)

    def normal(*shape, std=0.02):
        return torch.randn(*shape, generator=g) * std

    proj_std = 0.02 / math.sqrt(2 * L)
    wte = torch.zeros(VP, C)
    wte[:V] = normal(V, C)
    return [
        ("wte", wte), ("wpe", normal(MAXT, C)),
        ("ln1w", 1 + normal(L, C)), ("ln1b", normal(L, C)),
        ("qkvw", normal(L, 3 * C, C)), ("qkvb", normal(L, 3 * C)),
        ("attprojw", normal(L, C, C, std=proj_std)), ("attprojb", normal(L, C)),
        ("ln2w", 1 + normal(L, C)), ("ln2b", normal(L, C)),
        ("fcw", normal(L, 4 * C, C)), ("fcb", normal(L, 4 * C)),
        ("fcprojw", normal(L, C, 4 * C, std=proj_std)), ("fcprojb", normal(L, C)),
        ("lnfw", 1 + normal(C)), ("lnfb", normal(C)),
    ]


def forward(P, ids, targets):
    D = C // H
    x = P["wte"][ids] + P["wpe"][:T]
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    for l in range(L):
        a = F.layer_norm(x, (C,), P["ln1w"][l], P["ln1b"][l], eps=1e-5)
        q, k, v = F.linear(a, P["qkvw"][l], P["qkvb"][l]).split(C, dim=-1)
        q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(D)
        att = torch.softmax(att.masked_fill(mask, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + F.linear(y, P["attprojw"][l], P["attprojb"][l])
        m = F.layer_norm(x, (C,), P["ln2w"][l], P["ln2b"][l], eps=1e-5)
        h = F.gelu(F.linear(m, P["fcw"][l], P["fcb"][l]), approximate="tanh")
        x = x + F.linear(h, P["fcprojw"][l], P["fcprojb"][l])
    x = F.layer_norm(x, (C,), P["lnfw"], P["lnfb"], eps=1e-5)
    logits = (x @ P["wte"].t())[..., :V]  # the padded rows are not classes
    loss = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))
    return logits, loss.item()


def write_model(path, params, version):
    header = [20240326, version, MAXT, V, L, H, C, VP] + [0] * 248
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        for _, t in params:
            if version == 3:
                f.write(t.contiguous().numpy().astype("<f4").tobytes())
            else:
                f.write(t.to(torch.bfloat16).contiguous().view(torch.int16).numpy().astype("<i2").tobytes())
    print("wrote %s (%d bytes)" % (path, os.path.getsize(path)))


def main():
    torch.set_num_threads(1)
    params = make_params()
    g = torch.Generator().manual_seed(SEED + 1)
    ids = torch.randint(0, V, (B, T), generator=g)
    targets = torch.randint(0, V, (B, T), generator=g)
    logits, loss = forward(dict(params), ids, targets)
    rounded = [(n, t.to(torch.bfloat16).float()) for n, t in params]
    _, loss_bf16 = forward(dict(rounded), ids, targets)

    os.makedirs(OUT, exist_ok=True)
    write_model(os.path.join(OUT, "gpt2_llmc.bin"), params, 3)
    write_model(os.path.join(OUT, "gpt2_llmc_bf16.bin"), params, 5)
    ref = os.path.join(OUT, "gpt2_llmc_ref.bin")
    with open(ref, "wb") as f:
        f.write(b"LLMCREF1" + struct.pack("<3i", B, T, V))
        f.write(struct.pack("<%di" % (B * T), *ids.reshape(-1).tolist()))
        f.write(struct.pack("<%di" % (B * T), *targets.reshape(-1).tolist()))
        f.write(struct.pack("<2f", loss, loss_bf16))
        f.write(logits.detach().reshape(-1).numpy().astype("<f4").tobytes())
    print("wrote %s: loss %.6f (bf16 weights %.6f)" % (ref, loss, loss_bf16))


if __name__ == "__main__":
    main()
