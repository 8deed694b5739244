#!/usr/bin/env python3
"""Writes the example cluster files of tools/clusters/ from published peak figures.

These are *spec-derived*, not measured: each GEMM point is the vendor's peak times an assumed
efficiency for that size (small GEMMs cannot fill the device), each op-class curve a kernel launch
floor plus the bytes at an assumed fraction of the memory bandwidth. A real cluster file comes from
`pdde-bench` run on each machine kind. After writing, `pdde-bench --check FILE --rewrite` puts a file
in the canonical form that the library reads back byte for byte.

    python3 tools/clusters/gen_clusters.py && for f in tools/clusters/*.json; do build/pdde-bench --check $f --rewrite; done

`gen_clusters.py --scale DIR` writes the clusters of `make bench-planner` into DIR instead: V100-, A100-
and H100-like clusters of 8 to 4096 devices (machines of 8 devices, NVLink inside, the NIC between)
and mixed ones (half A100-like machines, a quarter V100-like, a quarter H100-like), named
<kind>_<devices>.json. They are written at bench time rather than committed (4096 devices are 0.5 MB).
"""
import json
import os
import sys

GiB = 1 << 30

# name: (kind, backend, f32 peak, bf16 peak, HBM B/s, memory bytes, NVLink-class busbw B/s, NIC B/s per node)
SPECS = {
    # V100 SXM2 32GB: 15.7 TFLOP/s f32, 125 f16 tensor; 900 GB/s HBM2; DGX-1: NVLink2, 4x100 Gb/s EDR
    "V100-like": ("gpu", "cuda", 15.7e12, 125e12, 0.9e12, 32 * GiB, 1.3e11, 4 * 12.5e9),
    # A100 SXM4 80GB: 19.5 f32, 312 bf16; 2.04 TB/s HBM2e; NVLink3; 8x200 Gb/s HDR
    "A100-like": ("gpu", "cuda", 19.5e12, 312e12, 2.04e12, 80 * GiB, 2.3e11, 8 * 25e9),
    # H100 SXM 80GB: 67 f32, 989 bf16 (dense); 3.35 TB/s HBM3; NVLink4; 8x400 Gb/s NDR
    "H100-like": ("gpu", "cuda", 67e12, 989e12, 3.35e12, 80 * GiB, 3.6e11, 8 * 50e9),
}

# efficiency of the peak by GEMM size (square side): launch- and tile-bound when small
GEMM_EFF = [(256, 0.25), (1024, 0.6), (4096, 0.8), (8192, 0.85)]
CLASSES = {  # fraction of the memory bandwidth a kernel of the class reaches, launch floor (s)
    "elementwise": (0.85, 4e-6), "row": (0.6, 6e-6), "attention": (0.5, 8e-6),
    "embedding": (0.4, 5e-6), "optimizer": (0.8, 5e-6),
}


def spec(name):
    kind, backend, f32, bf16, bw, _, _, _ = SPECS[name]
    gemm = []
    for dtype, peak in (("f32", f32), ("bf16", bf16)):
        for side, eff in GEMM_EFF:
            gemm.append({"dtype": dtype, "m": side, "n": side, "k": side, "flops": peak * eff})
    curves = {}
    for cls, (frac, floor) in CLASSES.items():
        curves[cls] = [[b, floor + b / (bw * frac)] for b in (1e4, 1e6, 1e8, 1e10)]
    return {"name": name, "kind": kind, "backend": backend, "peak_flops": f32, "mem_bandwidth": bw,
            "gemm": gemm, "curves": curves}


def machine(mid, spec_name, n_dev, first_id):
    _, _, _, _, _, mem, nvl, nic = SPECS[spec_name]
    return {
        "id": mid, "name": "node%d" % mid, "cores": 64, "numa_nodes": 2, "host_memory": 1024 * GiB,
        "l3_cache": 256 << 20,
        "intra": {"kind": "nvlink", "bandwidth": nvl, "latency": 8e-6, "group": -1},
        "nic": {"kind": "net", "bandwidth": nic, "latency": 5e-6, "group": -1},
        "devices": [{"id": first_id + d, "spec": spec_name, "memory": mem} for d in range(n_dev)],
    }


def cluster(name, layout):
    """layout: [(spec name, machines, devices per machine)]"""
    specs, machines, next_id = [], [], 0
    for spec_name, n_mach, per in layout:
        if spec_name not in [s["name"] for s in specs]:
            specs.append(spec(spec_name))
        for _ in range(n_mach):
            machines.append(machine(len(machines), spec_name, per, next_id))
            next_id += per
    return {"format": "pdde-cluster", "version": 1, "name": name, "specs": specs, "machines": machines,
            "links": [], "collectives": []}


SCALE_SIZES = (8, 64, 512, 4096)


def scale_files():
    files = {}
    for kind, spec_name in (("v100", "V100-like"), ("a100", "A100-like"), ("h100", "H100-like")):
        for n in SCALE_SIZES:
            files["%s_%d.json" % (kind, n)] = cluster("%s, %d machines x 8" % (spec_name, n // 8), [(spec_name, n // 8, 8)])
    for n in SCALE_SIZES:
        if n >= 64:  # machines of 8: a quarter of the machines is 2 at 64 devices
            m = n // 8
            files["mixed_%d.json" % n] = cluster("mixed: %d A100-like, %d V100-like, %d H100-like machines x 8" % (m // 2, m // 4, m // 4),
                                                 [("A100-like", m // 2, 8), ("V100-like", m // 4, 8), ("H100-like", m // 4, 8)])
    return files


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    if len(sys.argv) == 3 and sys.argv[1] == "--scale":
        os.makedirs(sys.argv[2], exist_ok=True)
        for fname, c in scale_files().items():
            with open(os.path.join(sys.argv[2], fname), "w") as f:
                json.dump(c, f, indent="\t")
                f.write("\n")
        return
    files = {
        "v100_32.json": cluster("V100-like, 4 machines x 8", [("V100-like", 4, 8)]),
        "a100_64.json": cluster("A100-like, 8 machines x 8", [("A100-like", 8, 8)]),
        "h100_128.json": cluster("H100-like, 16 machines x 8", [("H100-like", 16, 8)]),
        # heterogeneous: machines differ in device model, count and memory
        "mixed_28.json": cluster("mixed: 2 A100-like x 8, 2 V100-like x 4, 1 H100-like x 4",
                                 [("A100-like", 2, 8), ("V100-like", 2, 4), ("H100-like", 1, 4)]),
    }
    for fname, c in files.items():
        with open(os.path.join(here, fname), "w") as f:
            json.dump(c, f, indent="\t")
            f.write("\n")


if __name__ == "__main__":
    main()
