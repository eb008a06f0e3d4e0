"""The decode cases of docs/performance.md on an Apple-silicon Mac: mps_ext's
kernels vs torch's own MPS ops (that page times them on a CUDA proxy beside
ggml-metal's and MLX's kernels).

Llama-3-8B's projections and lm_head at 1 and 4 rows (bf16, fp16);
fp8_linear (per-channel scales) beside our bf16 GEMV on the same shapes;
Qwen3-30B-A3B's experts (128, top-8) at 1-32 tokens, bf16 and fp8_grouped_mm;
gpt-oss's experts stored (E, K, N); the softmax shapes (fp32, bf16). The case
list is tools/cuda_check/peers.py's (_decode_cases.py). torch's side of an FP8
case is its op on the weights dequantized to bf16 beforehand. Reports µs, GB/s
(the least the op must move: one byte per FP8 weight, for MoE only the routed
experts' weights), % of peak, the speedup over torch and, for FP8, its time
over our bf16 kernel's on the same weights (÷ bf16). Calls rotate through
enough input sets to move ROTATE_BYTES (as that page's do), so that no case is
timed from the system-level cache.
Usage: python benchmarks/bench_decode.py [--families gemv moe ...] [--list]
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import math
import sys
from typing import Callable

import torch
import torch.nn.functional as F

import _common
import mps_ext
from _common import TIMING, Column, compare, peak_gbps, time_us
from _decode_cases import BF16, Case, cases
from bench_grouped_mm import routed

FAMILIES = list(dict.fromkeys(case.family for case in cases()))
# Calls rotate through input sets that move at least this many bytes together (or MAX_SETS of them): well
# past an M-series chip's system-level cache (tens of MB), which would otherwise serve a small case's
# weights from the second call on. docs/performance.md's proxy rotates through 4x the H200's L2 likewise.
ROTATE_BYTES = 256 << 20
MAX_SETS = 16


@dataclasses.dataclass
class Calls:
    """A case on its inputs: torch's op, ours, the bytes ours must move at least and, for FP8, our bf16
    kernel on the same weights dequantized."""

    theirs: Callable
    ours: Callable
    moved: int
    bf16: Callable | None = None


def cycling(op: Callable, sets: list[tuple]) -> Callable:
    """op on the next input set at each call."""
    inputs = itertools.cycle(sets)
    return lambda: op(*next(inputs))


def gemv(case: Case, device: str, sets: int = 1) -> Calls:
    """x (m, k) @ W.T, W (n, k): F.linear without bias; each set its own W and x."""
    (n, k, m), dtype = case.dims, case.dtype
    ins = [(torch.randn(m, k, device=device, dtype=dtype), torch.randn(n, k, device=device, dtype=dtype) / math.sqrt(k))
           for _ in range(sets)]
    return Calls(cycling(F.linear, ins), cycling(mps_ext.linear, ins), (n * k + m * k + m * n) * 2)


def fp8(case: Case, device: str, sets: int = 1) -> Calls:
    """fp8_linear on e4m3fn weights with one scale per row, beside F.linear on them dequantized to bf16."""
    n, k, m = case.dims
    ins = []
    for _ in range(sets):
        q, scale = mps_ext.fp8.quantize(torch.randn(n, k, device=device, dtype=BF16) / math.sqrt(k), dim=1)
        ins.append((torch.randn(m, k, device=device, dtype=BF16), q, scale, mps_ext.fp8.dequantize(q, scale, BF16)))
    return Calls(cycling(lambda x, q, s, w: F.linear(x, w), ins),
                 cycling(lambda x, q, s, w: mps_ext.fp8_linear(x, q, s), ins), n * k + n * 4 + (m * k + m * n) * 2,
                 bf16=cycling(lambda x, q, s, w: mps_ext.linear(x, w), ins))


def routings(case: Case, device: str, sets: int) -> tuple[list[tuple], int]:
    """`sets` random top-k routings of the case's tokens (rows, offs) and the experts they touch on average."""
    e, top_k, _, n, k, tokens = case.dims
    routes = [routed(tokens, e, top_k, k, device) for _ in range(sets)]
    return [(a, offs) for a, offs, _ in routes], round(sum(touched for *_, touched in routes) / sets)


def moe(case: Case, device: str, sets: int = 1) -> Calls:
    """Rows sorted by expert, experts (E, N, K) passed transposed, as transformers calls torch._grouped_mm;
    each set its own routing of the same experts."""
    e, top_k, _, n, k, tokens = case.dims
    b = (torch.randn(e, n, k, device=device, dtype=BF16) / math.sqrt(k)).transpose(-2, -1)
    ins, touched = routings(case, device, sets)
    return Calls(cycling(lambda a, offs: torch._grouped_mm(a, b, offs=offs), ins),
                 cycling(lambda a, offs: mps_ext.grouped_mm(a, b, offs), ins),
                 (touched * n * k + tokens * top_k * (k + n)) * 2)


def moe_fp8(case: Case, device: str, sets: int = 1) -> Calls:
    """fp8_grouped_mm on e4m3fn experts with one scale per row, beside grouped_mm on them dequantized."""
    e, top_k, _, n, k, tokens = case.dims
    q, scale = mps_ext.fp8.quantize(torch.randn(e, n, k, device=device, dtype=BF16) / math.sqrt(k), dim=-1)
    b = mps_ext.fp8.dequantize(q, scale, BF16).transpose(-2, -1)
    ins, touched = routings(case, device, sets)
    return Calls(cycling(lambda a, offs: torch._grouped_mm(a, b, offs=offs), ins),
                 cycling(lambda a, offs: mps_ext.fp8_grouped_mm(a, q, scale, offs), ins),
                 touched * n * k + tokens * top_k * (k + n) * 2,
                 bf16=cycling(lambda a, offs: mps_ext.grouped_mm(a, b, offs), ins))


def moe_kn(case: Case, device: str, sets: int = 1) -> Calls:
    """Experts stored (E, K, N) and passed as they are (transformers' gpt-oss)."""
    e, top_k, _, n, k, tokens = case.dims
    b = torch.randn(e, k, n, device=device, dtype=BF16) / math.sqrt(k)
    ins, touched = routings(case, device, sets)
    return Calls(cycling(lambda a, offs: torch._grouped_mm(a, b, offs=offs), ins),
                 cycling(lambda a, offs: mps_ext.grouped_mm(a, b, offs), ins),
                 (touched * n * k + tokens * top_k * (k + n)) * 2)


def softmax(case: Case, device: str, sets: int = 1) -> Calls:
    """Softmax over the last dimension of a contiguous (rows, cols)."""
    ins = [(torch.randn(*case.dims, device=device, dtype=case.dtype) * 3,) for _ in range(sets)]
    return Calls(cycling(lambda x: torch.softmax(x, -1), ins), cycling(lambda x: mps_ext.softmax(x, -1), ins),
                 2 * ins[0][0].numel() * ins[0][0].element_size())


def rotating(case: Case, device: str) -> Calls:
    """The case's calls on as many input sets as move ROTATE_BYTES together (at most MAX_SETS)."""
    build = CALLS[case.family]
    calls = build(case, device)
    sets = min(MAX_SETS, -(-ROTATE_BYTES // calls.moved))
    if sets == 1:
        return calls
    del calls
    return build(case, device, sets)


CALLS = {"gemv": gemv, "fp8": fp8, "moe": moe, "moe_fp8": moe_fp8, "moe_kn": moe_kn, "softmax": softmax}


def label(case: Case) -> str:
    """The case's name in the table: its table of docs/performance.md (the family) and its row there."""
    return f"{case.family} {case.name}"


TITLE = "the decode cases of docs/performance.md (Llama-3-8B, Qwen3-30B-A3B, gpt-oss, softmax)"
COLUMNS = [Column("case", "case", "", 24), *TIMING[:5], Column("bf16_us", "bf16 µs", ".1f", 8),
           Column("fp8_over_bf16", "÷ bf16", ".2f", 7), TIMING[5]]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--families", nargs="+", choices=FAMILIES, default=FAMILIES, help="only these tables")
    p.add_argument("--list", action="store_true", help="print the cases and exit (works without a GPU)")
    return p


def rows(args, chip):
    peak = peak_gbps(chip)
    for case in cases():
        if case.family not in args.families:
            continue
        calls = rotating(case, "mps")
        row = compare(label(case), calls.theirs, calls.ours, moved=calls.moved, peak=peak)
        if calls.bf16:
            row["bf16_us"] = time_us(calls.bf16)
            row["fp8_over_bf16"] = row["mps_ext_us"] / row["bf16_us"]
        yield row
        del calls  # lm_head's weights, or the 128 experts, take about 1 GB: one case's at a time


def main() -> None:
    """The table on this Mac's GPU, or with --list the cases (anywhere)."""
    args = parser().parse_args()
    if args.list:
        print("\n".join(label(case) for case in cases() if case.family in args.families))
    else:
        _common.main(sys.modules[__name__])


if __name__ == "__main__":
    main()
