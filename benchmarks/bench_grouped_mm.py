"""Grouped matmul (Mixture-of-Experts experts): mps_ext's kernels vs torch's own
torch._grouped_mm on MPS (the per-group loop of 2.13/2.14, the MPS kernel of
2.15), bf16, on an Apple-silicon Mac.

Decode: 1-8 tokens routed top-k of E experts (b the transposed expert weights,
as transformers passes them); prefill: 512 tokens. Reports microseconds, the
bandwidth over the touched experts' weights (each read once: the least a
grouped product must move), its share of the chip's peak, and the speedup.
Usage: python benchmarks/bench_grouped_mm.py [--tokens 1 2 4 8] [--filter gpt]
"""

import argparse
import math
import sys

import torch

import mps_ext
from _common import TIMING, Column, compare, main, peak_gbps

# (model, projection, K, N, experts, top-k) from each model's config.json
# (hidden_size, moe_intermediate_size / intermediate_size, num_experts, top-k);
# gate and up fused, as transformers 5 stores them.
SHAPES = [
    ("Qwen3-30B-A3B", "gate_up", 2048, 2 * 768, 128, 8),
    ("Qwen3-30B-A3B", "down", 768, 2048, 128, 8),
    ("gpt-oss-20b", "gate_up", 2880, 2 * 2880, 32, 4),
    ("gpt-oss-20b", "down", 2880, 2880, 32, 4),
    ("gpt-oss-120b", "gate_up", 2880, 2 * 2880, 128, 4),
    ("Mixtral 8x7B", "w1/w3", 4096, 2 * 14336, 8, 2),
]


def routed(tokens, experts, top_k, k, device="mps"):
    """Tokens sorted by expert (a) and offs of a random top-k routing; how many experts it touches."""
    chosen = torch.rand(tokens, experts).topk(top_k, dim=-1).indices.flatten()
    counts = torch.bincount(chosen, minlength=experts)
    offs = counts.cumsum(0).to(torch.int32).to(device)
    a = torch.randn(tokens * top_k, k, device=device, dtype=torch.bfloat16)
    return a, offs, int((counts > 0).sum())


TITLE = "torch._grouped_mm (MoE experts), bf16"
COLUMNS = [Column("model", "model", "", 14), Column("proj", "proj", "", 8), Column("tokens", "tokens", "d", 6),
           Column("experts", "experts", "", 8), *TIMING]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 2, 4, 8, 512])
    p.add_argument("--filter", default="", help="only models whose name contains this")
    return p


def rows(args, chip):
    peak = peak_gbps(chip)
    for model, proj, k, n, e, top_k in SHAPES:
        if args.filter not in model:
            continue
        weights = torch.randn(e, n, k, device="mps", dtype=torch.bfloat16) / math.sqrt(k)
        b = weights.transpose(-2, -1)
        for tokens in args.tokens:
            a, offs, touched = routed(tokens, e, top_k, k)
            moved = (touched * n * k + a.numel() + a.shape[0] * n) * 2
            yield compare(f"{model} {proj} {tokens} tok", lambda: torch._grouped_mm(a, b, offs=offs),
                          lambda: mps_ext.grouped_mm(a, b, offs), moved=moved, peak=peak, model=model, proj=proj,
                          tokens=tokens, experts=f"{touched}/{e}")
        del weights, b


if __name__ == "__main__":
    main(sys.modules[__name__])
