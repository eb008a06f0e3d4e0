"""The cases of docs/performance.md, in its tables' order: timed on a Mac by bench_decode.py against torch's
MPS ops, and on a CUDA GPU beside ggml-metal's and MLX's kernels by tools/cuda_check/peers.py. Needs torch
only (neither mps_ext nor a GPU), so that both import it.
"""

from __future__ import annotations

import dataclasses

import torch

BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32
DTYPE_NAME = {BF16: "bf16", F16: "fp16", F32: "fp32"}

# Llama-3-8B: (label, n, k)
GEMV_SHAPES = [("q_proj", 4096, 4096), ("gate/up", 14336, 4096), ("down", 4096, 14336), ("lm_head", 128256, 4096)]
# Qwen3-30B-A3B's experts (128, top-8): (op, n, k)
MOE_SHAPES = [("gate_up", 1536, 2048), ("down", 2048, 768)]
MOE_TOKENS = (1, 4, 8, 16, 32)
# gpt-oss-20b (32 experts) and 120b (128), top-4, experts stored (E, K, N): (E, op, n, k, tokens)
MOE_KN = [(32, "gate_up", 5760, 2880, (1, 4)), (32, "down", 2880, 2880, (1, 4)),
          (128, "gate_up", 5760, 2880, (1,)), (128, "down", 2880, 2880, (1,))]
SOFTMAX_SHAPES = [(1, 151936), (64, 151936), (4096, 128), (16384, 64), (256, 4096)]


@dataclasses.dataclass(frozen=True)
class Case:
    """One row of docs/performance.md. dims: gemv and fp8 (n, k, m); moe, moe_fp8 and moe_kn
    (experts, top-k, op, n, k, tokens); softmax (rows, cols)."""

    family: str  # gemv, fp8, moe, moe_fp8, moe_kn, softmax: one table each
    name: str
    dims: tuple
    dtype: torch.dtype


def cases() -> list[Case]:
    """Every case of docs/performance.md's tables, in the tables' order."""
    out = [Case("gemv", f"{label} m={m} {DTYPE_NAME[dt]}", (n, k, m), dt)
           for dt in (BF16, F16) for m in (1, 4) for label, n, k in GEMV_SHAPES]
    out += [Case("fp8", f"{label} m={m}", (n, k, m), BF16) for m in (1, 4) for label, n, k in GEMV_SHAPES]
    for family in ("moe", "moe_fp8"):
        out += [Case(family, f"{op} T={t}", (128, 8, op, n, k, t), BF16) for op, n, k in MOE_SHAPES
                for t in MOE_TOKENS]
    out += [Case("moe_kn", f"{op} E={e} T={t}", (e, 4, op, n, k, t), BF16) for e, op, n, k, tokens in MOE_KN
            for t in tokens]
    out += [Case("softmax", f"{rows}x{cols} {DTYPE_NAME[dt]}", (rows, cols), dt)
            for dt in (F32, BF16) for rows, cols in SOFTMAX_SHAPES]
    return out
