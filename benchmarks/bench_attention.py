"""Attention as LLMs and their training call it (F.scaled_dot_product_attention; gpt-oss through
mps_ext.scaled_dot_product_attention with its sinks), mps_ext's kernels vs torch's own MPS op, on an
Apple-silicon Mac.

Decode (1 and 4 query rows over a KV cache of 512 to 32768 keys, batch 1 and 4): GB/s counts the K/V cache read
once (torch's decode kernel reads it once per query head under GQA). Prefill (causal, as long as the keys) and a
training step (forward and backward of a causal prefill) are compute-bound: their GB/s column counts q, k, v and
the output once and says little. torch's side of a sinks case is gpt-oss's eager attention (logits, a sink
column, softmax), the only way torch computes it. Usage: python benchmarks/bench_attention.py [--dtype bf16 fp16]
"""

import argparse
import sys

import torch
import torch.nn.functional as F

import mps_ext
from _attention_cases import DECODE, MODELS, PREFILL, TRAINING
from _common import TIMING, Column, compare, main, peak_gbps

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
TITLE = "attention as LLMs and their training call it"
COLUMNS = [Column("case", "case", "", 34), Column("dtype", "dtype", "", 5), *TIMING]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtype", choices=list(DTYPES), nargs="+", default=["bf16"])
    return p


def eager_with_sinks(q, k, v, sinks, is_causal):
    """gpt-oss's eager attention: the scores, a sink column, softmax, the column dropped."""
    group = q.size(1) // k.size(1)
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = q @ k.transpose(-2, -1) * q.size(-1) ** -0.5
    if is_causal:
        scores = scores + torch.full(scores.shape[-2:], float("-inf"), device=q.device).triu(1)
    logits = torch.cat([scores, sinks.reshape(1, -1, 1, 1).expand(*scores.shape[:-1], 1)], -1)
    return torch.softmax(logits.float(), -1).to(q.dtype)[..., :-1] @ v


def calls(heads, kv_heads, dim, v_dim, sinks, batch, rows, keys, dtype, causal):
    q = torch.randn(batch, heads, rows, dim, device="mps", dtype=dtype)
    k = torch.randn(batch, kv_heads, keys, dim, device="mps", dtype=dtype)
    v = torch.randn(batch, kv_heads, keys, v_dim, device="mps", dtype=dtype)
    if sinks:
        s = torch.randn(heads, device="mps", dtype=dtype)
        return (q, k, v), (lambda: eager_with_sinks(q, k, v, s, causal),
                           lambda: mps_ext.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True,
                                                                        sinks=s))
    run = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=heads != kv_heads)
    return (q, k, v), (run, run)


def rows(args, chip):
    peak = peak_gbps(chip)
    for dname in args.dtype:
        dtype = DTYPES[dname]
        for model, heads, kv_heads, dim, v_dim, sinks in MODELS:
            for batch, q_len, keys in DECODE:
                (q, k, v), (theirs, ours) = calls(heads, kv_heads, dim, v_dim, sinks, batch, q_len, keys, dtype, False)
                yield compare(f"{model} decode b{batch} q{q_len} kv{keys}", theirs, ours,
                              moved=(k.numel() + v.numel()) * k.element_size(), peak=peak, dtype=dname)
            for length in PREFILL:
                (q, k, v), (theirs, ours) = calls(heads, kv_heads, dim, v_dim, sinks, 1, length, length, dtype, True)
                out = q.numel() // dim * v_dim
                yield compare(f"{model} prefill {length}", theirs, ours,
                              moved=(q.numel() + k.numel() + v.numel() + out) * q.element_size(), peak=peak,
                              dtype=dname)
            torch.mps.empty_cache()
        for model, length in TRAINING:
            _, heads, kv_heads, dim, v_dim, _ = next(m for m in MODELS if m[0] == model)
            (q, k, v), _ = calls(heads, kv_heads, dim, v_dim, False, 1, length, length, dtype, True)
            leaves = [t.requires_grad_() for t in (q, k, v)]
            dout = torch.randn(1, heads, length, v_dim, device="mps", dtype=dtype)

            def step(leaves=leaves, dout=dout):
                out = F.scaled_dot_product_attention(*leaves, is_causal=True, enable_gqa=True)
                return torch.cat([g.flatten() for g in torch.autograd.grad(out, leaves, dout)])

            yield compare(f"{model} training step {length}", step, step,
                          moved=sum(2 * t.numel() * t.element_size() for t in leaves), peak=peak, dtype=dname)


if __name__ == "__main__":
    main(sys.modules[__name__])
