"""FP8 weight-only linear on an Apple-silicon Mac: mps_ext.fp8_linear vs the
bf16 linear of the same shape and vs what torch offers for an FP8 weight.

torch's FP8 path (torch's own kernels): 2.13/2.14 cannot hold float8 tensors on mps, so users
dequantize (here: mps_ext.fp8.dequantize to bf16, then F.linear); 2.15 holds
them and dequantizes with `weight.to(bf16) * scale` before F.linear. For
scaled_mm (fp8 x fp8) on 2.15, torch's native `F.scaled_mm` is timed too.
Reports µs, effective bandwidth (weight bytes + activations + output: one
byte per FP8 weight, two per bf16 weight), % of peak, and speedups.
Usage: python benchmarks/bench_fp8.py
"""

import argparse
import sys

import torch
import torch.nn.functional as F

import mps_ext
from _common import Column, compare, main, peak_gbps, time_us

SHAPES = ((4096, 4096), (14336, 4096), (4096, 14336), (151936, 2048))  # (out_features, in_features)
ROWS = (1, 4, 8, 512)  # decode and prefill


TITLE = "FP8 (e4m3fn) weight-only linear and scaled_mm, bf16 activations"
COLUMNS = [Column("op", "op", "", 9), Column("shape", "rows x out x in", "", 20),
           Column("bf16_us", "bf16 µs", ".1f", 9), Column("torch_us", "torch fp8 µs", ".1f", 13),
           Column("mps_ext_us", "fp8 µs", ".1f", 8), Column("gbps", "GB/s", ".1f", 7),
           Column("pct_peak", "% peak", ".1f", 7), Column("vs_bf16", "vs bf16", ".2f", 8),
           Column("speedup", "vs torch", ".2f", 9)]


def parser() -> argparse.ArgumentParser:
    return argparse.ArgumentParser(description=__doc__.splitlines()[0])


def rows(args, chip):
    peak = peak_gbps(chip)
    torch215 = tuple(int(v) for v in torch.__version__.split(".")[:2]) >= (2, 15)
    for n, k in SHAPES:
        w = torch.randn(n, k, device="mps", dtype=torch.bfloat16) * 0.02
        q, scale = mps_ext.fp8.quantize(w, dim=1)
        for m in ROWS:
            x = torch.randn(m, k, device="mps", dtype=torch.bfloat16)
            if torch215:
                theirs = lambda: F.linear(x, q.to(torch.bfloat16) * scale.bfloat16())  # noqa: E731
            else:
                theirs = lambda: F.linear(x, mps_ext.fp8.dequantize(q, scale, torch.bfloat16))  # noqa: E731
            t_bf16 = time_us(lambda: F.linear(x, w))  # mps_ext's bf16 GEMV up to 8 rows (the overrides)
            row = compare(f"fp8_linear {m}x{n}x{k}", theirs, lambda: mps_ext.fp8_linear(x, q, scale),
                          moved=n * k + 2 * m * (k + n), peak=peak, op="linear", shape=f"{m}x{n}x{k}", bf16_us=t_bf16)
            row["vs_bf16"] = t_bf16 / row["mps_ext_us"]
            yield row
    # scaled_mm (fp8 x fp8, row-wise scales, bf16 out); torch has an MPS kernel from 2.15 only.
    for n, k in SHAPES[:3]:
        wq, ws = mps_ext.fp8.quantize(torch.randn(n, k, device="mps"), dim=1)
        for m in ROWS:
            aq, as_ = mps_ext.fp8.quantize(torch.randn(m, k, device="mps"), dim=1)
            b, sb = wq.t(), ws.t()
            ours = lambda: mps_ext.scaled_mm(aq, b, as_, sb)  # noqa: E731
            if torch215:
                sr = F.ScalingType.RowWise
                theirs = lambda: F.scaled_mm(aq, b, as_, sr, sb, sr, output_dtype=torch.bfloat16)  # noqa: E731
                yield compare(f"scaled_mm {m}x{n}x{k}", theirs, ours, check=False, op="scaled_mm", shape=f"{m}x{n}x{k}")
            else:
                yield {"case": f"scaled_mm {m}x{n}x{k}", "op": "scaled_mm", "shape": f"{m}x{n}x{k}",
                       "mps_ext_us": time_us(ours), "speedup": None, "note": "torch < 2.15: no MPS kernel"}


if __name__ == "__main__":
    main(sys.modules[__name__])
