"""dispatch_torch.py — the PyTorch eager peer of bench_dispatch.c: the same deep, narrow MLP
(relu(h W + b) per layer, a last W, cross-entropy, AdamW) trained on the CPU (--device cuda: on the
GPU, each step ending in reading the loss), step after step.

Prints "TORCH step_us=<median step, us> ops=<aten ops one step dispatches>" (the ops counted once, in
an untimed step, with a TorchDispatchMode). Run by bench_dispatch; alone:
    OMP_NUM_THREADS=1 /usr/bin/python3 tools/bench/dispatch_torch.py --width 16 --depth 48 --batch 8
"""
import argparse
import os
import statistics
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--width", type=int, default=16)
    ap.add_argument("--depth", type=int, default=48)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import torch
    import torch.nn.functional as F
    from torch.utils._python_dispatch import TorchDispatchMode

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    W, L, B, K, dev = a.width, a.depth, a.batch, 4, torch.device(a.device)
    ws = [(torch.randn(W, W) * (2.0 / W) ** 0.5).to(dev).requires_grad_(True) for _ in range(L)]
    bs = [torch.zeros(W, device=dev, requires_grad=True) for _ in range(L)]
    wo = (torch.randn(W, K) * (2.0 / W) ** 0.5).to(dev).requires_grad_(True)
    opt = torch.optim.AdamW(ws + bs + [wo], lr=1e-3)
    x = torch.tensor([((i * 2654435761) % (1 << 32) % 1000) / 1000.0 - 0.5 for i in range(B * W)]).reshape(B, W).to(dev)
    t = torch.tensor([i % K for i in range(B)]).to(dev)

    def step():
        h = x
        for w, b in zip(ws, bs):
            h = torch.relu(h @ w + b)
        loss = F.cross_entropy(h @ wo, t)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if dev.type == "cuda":
            loss.item()  # (pdde's step ends reading its loss: the same synchronisation)
        return loss

    for _ in range(10):
        step()

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += 1
            return func(*args, **(kwargs or {}))

    with Count():
        step()
    times = []
    for _ in range(a.reps):
        t0 = time.perf_counter()
        for _ in range(a.steps):
            loss = step()
        times.append((time.perf_counter() - t0) / a.steps)
    print("torch %s, %d thread(s); loss %.6f" % (torch.__version__, torch.get_num_threads(), loss.item()), file=sys.stderr)
    print("TORCH step_us=%.3f ops=%d" % (statistics.median(times) * 1e6, Count.n))


if __name__ == "__main__":
    main()
