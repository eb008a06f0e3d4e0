"""Decode-time linear (GEMV): mps_ext's kernels vs torch's own F.linear on MPS,
over bf16 layer shapes of published models, on an Apple-silicon Mac.

For 1 and 4 rows of activations, reports microseconds, effective bandwidth
(weights once, plus x, bias and y: the least a linear layer must move), its
share of the chip's peak, the speedup, and the geometric-mean speedup over all
shapes. Usage: python benchmarks/bench_linear.py [--rows 1 4] [--filter Llama]
"""

import argparse
import math
import sys

import torch
import torch.nn.functional as F

import mps_ext
from _common import TIMING, Column, compare, main, peak_gbps


def dense(model, hidden, inter, heads, kv_heads, head_dim, vocab):
    """The linear layers of a dense decoder (Llama-style attention + gated MLP): (model, layer, n, k)."""
    q, kv = heads * head_dim, kv_heads * head_dim
    attention = [("q_proj, o_proj", q, hidden)] if q == hidden else [("q_proj", q, hidden), ("o_proj", hidden, q)]
    layers = attention + [("k_proj, v_proj", kv, hidden), ("gate_proj, up_proj", inter, hidden),
                          ("down_proj", hidden, inter), ("lm_head", vocab, hidden)]
    return [(model, *layer) for layer in layers]


def moe(model, hidden, heads, kv_heads, head_dim, experts, expert_inter, vocab):
    """Attention, router, one expert's projections and the LM head of a Mixture-of-Experts decoder."""
    q, kv = heads * head_dim, kv_heads * head_dim
    return [(model, "q_proj", q, hidden), (model, "o_proj", hidden, q), (model, "k_proj, v_proj", kv, hidden),
            (model, "router", experts, hidden), (model, "expert gate/up", expert_inter, hidden),
            (model, "expert down", hidden, expert_inter), (model, "lm_head", vocab, hidden)]


# Sizes from each model's published config.json (hidden_size, intermediate_size,
# num_attention_heads, num_key_value_heads, head_dim, vocab_size; experts).
SHAPES = [
    *dense("Llama 3 8B", 4096, 14336, 32, 8, 128, 128256),
    *dense("Llama 3 70B", 8192, 28672, 64, 8, 128, 128256),
    *dense("Llama 3.2 1B", 2048, 8192, 32, 8, 64, 128256),
    *dense("Llama 3.2 3B", 3072, 8192, 24, 8, 128, 128256),
    *dense("Mistral 7B", 4096, 14336, 32, 8, 128, 32000),
    *dense("Qwen2.5 0.5B", 896, 4864, 14, 2, 64, 151936),
    *dense("Qwen2.5 1.5B", 1536, 8960, 12, 2, 128, 151936),
    *dense("Qwen2.5 7B", 3584, 18944, 28, 4, 128, 152064),
    *dense("Qwen2.5 14B", 5120, 13824, 40, 8, 128, 152064),
    *dense("Qwen2.5 32B", 5120, 27648, 40, 8, 128, 152064),
    *dense("Qwen3 0.6B", 1024, 3072, 16, 8, 128, 151936),
    *dense("Qwen3 4B", 2560, 9728, 32, 8, 128, 151936),
    *dense("Qwen3 8B", 4096, 12288, 32, 8, 128, 151936),
    *dense("Gemma 2 2B", 2304, 9216, 8, 4, 256, 256000),
    *dense("Gemma 2 9B", 3584, 14336, 16, 8, 256, 256000),
    *dense("Gemma 3 4B", 2560, 10240, 8, 4, 256, 262208),
    *dense("Gemma 3 12B", 3840, 15360, 16, 8, 256, 262208),
    *moe("Qwen3-30B-A3B", 2048, 32, 4, 128, 128, 768, 151936),
    *moe("Qwen3-235B-A22B", 4096, 64, 4, 128, 128, 1536, 151936),
    *moe("Mixtral 8x7B", 4096, 32, 8, 128, 8, 14336, 32000),
    *moe("gpt-oss-20b", 2880, 64, 8, 64, 32, 2880, 201088),
    # Phi-3 fuses q/k/v and gate/up into single projections.
    ("Phi-3 mini", "qkv_proj", 9216, 3072), ("Phi-3 mini", "o_proj", 3072, 3072),
    ("Phi-3 mini", "gate_up_proj", 16384, 3072), ("Phi-3 mini", "down_proj", 3072, 8192),
    ("Phi-3 mini", "lm_head", 32064, 3072),
    ("Phi-3 medium", "qkv_proj", 7680, 5120), ("Phi-3 medium", "o_proj", 5120, 5120),
    ("Phi-3 medium", "gate_up_proj", 35840, 5120), ("Phi-3 medium", "down_proj", 5120, 17920),
    ("Phi-3 medium", "lm_head", 32064, 5120),
    # DeepSeek-V3: multi-head latent attention, 256 routed experts.
    ("DeepSeek-V3", "q_a_proj", 1536, 7168), ("DeepSeek-V3", "q_b_proj", 24576, 1536),
    ("DeepSeek-V3", "kv_a_proj_with_mqa", 576, 7168), ("DeepSeek-V3", "kv_b_proj", 32768, 512),
    ("DeepSeek-V3", "o_proj", 7168, 16384), ("DeepSeek-V3", "router", 256, 7168),
    ("DeepSeek-V3", "expert gate/up", 2048, 7168), ("DeepSeek-V3", "expert down", 7168, 2048),
    ("DeepSeek-V3", "lm_head", 129280, 7168),
]
assert len(SHAPES) >= 96


TITLE = f"F.linear (decode GEMV), bf16, {len(SHAPES)} layer shapes"
COLUMNS = [Column("model", "model", "", 16), Column("layer", "layer", "", 20), Column("rows", "rows", "d", 4),
           Column("shape", "n x k", "", 14), *TIMING]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, nargs="+", default=[1, 4])
    p.add_argument("--filter", default="", help="only models whose name contains this")
    return p


def rows(args, chip):
    peak = peak_gbps(chip)
    for model, layer, n, k in SHAPES:
        if args.filter not in model:
            continue
        w = torch.randn(n, k, device="mps", dtype=torch.bfloat16) / math.sqrt(k)
        # gpt-oss projections carry a bias (fused into the kernel).
        b = torch.randn(n, device="mps", dtype=torch.bfloat16) if "gpt-oss" in model and layer != "lm_head" else None
        for m in args.rows:
            x = torch.randn(m, 1, k, device="mps", dtype=torch.bfloat16)
            moved = (n * k + m * k + m * n + (n if b is not None else 0)) * 2
            yield compare(f"{model} {layer} {m}x{n}x{k}", lambda: F.linear(x, w, b), lambda: mps_ext.linear(x, w, b),
                          moved=moved, peak=peak, model=model, layer=layer, rows=m, shape=f"{n}x{k}")
        del w


if __name__ == "__main__":
    main(sys.modules[__name__])
