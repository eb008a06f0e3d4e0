"""The attention cases of docs/performance.md: timed on a Mac by bench_attention.py against torch's MPS SDPA, and
on a CUDA GPU beside ggml-metal's and MLX's kernels by tools/cuda_check/peers.py. Needs torch only (neither mps_ext
nor a GPU), so that both import it.
"""

from __future__ import annotations

from _decode_cases import BF16, Case

# (model, query heads, KV heads, head dim, value head dim, sinks)
MODELS = [("llama-3-8b", 32, 8, 128, 128, False), ("qwen3-8b", 32, 8, 128, 128, False),
          ("mistral-7b", 32, 8, 128, 128, False), ("gemma-2-9b", 16, 8, 256, 256, False),
          ("phi-3-mini", 32, 32, 96, 96, False), ("gpt-oss-20b", 64, 8, 64, 64, True),
          ("mla 192/128", 16, 16, 192, 128, False)]
# (batch, query rows, keys): every key length at batch 1 and one query row; batch 4 and four query rows
# (speculative decoding) at 4096 keys only.
DECODE = [(1, 1, 512), (1, 1, 4096), (1, 1, 32768), (4, 1, 4096), (1, 4, 4096)]
# Causal prefill, the keys as long as the query.
PREFILL = [512, 4096]
# The models whose prefill the peers tool times: one of the 32/8 d 128 shapes and gpt-oss's (d 64, sinks).
PREFILL_MODELS = ("llama-3-8b", "gpt-oss-20b")
TRAINING = [("llama-3-8b", 2048)]


def shapes() -> list[tuple[str, tuple]]:
    """The distinct attention shapes of MODELS, each named by every model that has it (Llama-3-8B, Qwen3-8B and
    Mistral-7B attend alike: 32 query heads over 8 KV heads of 128): [(label, (heads, KV heads, dim, value dim,
    sinks))]."""
    out: dict[tuple, list[str]] = {}
    for model, *shape in MODELS:
        out.setdefault(tuple(shape), []).append(model)
    return [("/".join(names), shape) for shape, names in out.items()]


def cases() -> list[Case]:
    """The peers tool's attention cases, bf16: dims (heads, KV heads, dim, value dim, sinks, batch, query rows,
    keys, causal)."""
    out = [Case("attention", f"{label} decode b{b} q{q} kv{keys}", (*shape, b, q, keys, False), BF16)
           for label, shape in shapes() for b, q, keys in DECODE]
    for label, shape in shapes():
        if any(model in PREFILL_MODELS for model in label.split("/")):
            out += [Case("attention", f"{label} prefill {n}", (*shape, 1, n, n, True), BF16) for n in PREFILL]
    return out
