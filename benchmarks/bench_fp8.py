"""FP8 weight-only linear on an Apple-silicon Mac: mps_ext.fp8_linear vs the
bf16 linear of the same shape and vs what torch offers for an FP8 weight.

torch's FP8 path: 2.13/2.14 cannot hold float8 tensors on mps, so users
dequantize (here: mps_ext.fp8.dequantize to bf16, then F.linear); 2.15 holds
them and dequantizes with `weight.to(bf16) * scale` before F.linear. For
scaled_mm (fp8 x fp8) on 2.15, torch's native `F.scaled_mm` is timed too.
Reports µs, effective bandwidth (weight bytes + activations + output: one
byte per FP8 weight, two per bf16 weight), % of peak, and speedups.
Usage: python benchmarks/bench_fp8.py
"""

import torch
import torch.nn.functional as F

import mps_ext
from _common import peak_gbps, require_mps, time_us

SHAPES = ((4096, 4096), (14336, 4096), (4096, 14336), (151936, 2048))  # (out_features, in_features)
ROWS = (1, 4, 8, 512)  # decode and prefill


def gbps(nbytes: int, us: float) -> float:
    return nbytes / (us * 1e-6) / 1e9


def main():
    name = require_mps()
    peak = peak_gbps(name)
    torch215 = tuple(int(v) for v in torch.__version__.split(".")[:2]) >= (2, 15)
    print(f"{name}, peak {peak or '?'} GB/s, torch {torch.__version__}")
    print(f"{'rows x out x in':>20} {'bf16 µs':>9} {'torch fp8 µs':>13} {'fp8 µs':>8} {'fp8 GB/s':>9} {'% peak':>7} "
          f"{'vs bf16':>8} {'vs torch':>9}")
    for n, k in SHAPES:
        w = torch.randn(n, k, device="mps", dtype=torch.bfloat16) * 0.02
        q, scale = mps_ext.fp8.quantize(w, dim=1)
        for m in ROWS:
            x = torch.randn(m, k, device="mps", dtype=torch.bfloat16)
            t_bf16 = time_us(lambda: F.linear(x, w))
            if torch215:
                t_torch = time_us(lambda: F.linear(x, q.to(torch.bfloat16) * scale.bfloat16()))
            else:
                t_torch = time_us(lambda: F.linear(x, mps_ext.fp8.dequantize(q, scale, torch.bfloat16)))
            t_fp8 = time_us(lambda: mps_ext.fp8_linear(x, q, scale))
            moved = n * k + 2 * m * (k + n)
            bw = gbps(moved, t_fp8)
            share = f"{100 * bw / peak:6.1f}%" if peak else "     ?"
            print(f"{f'{m}x{n}x{k}':>20} {t_bf16:>9.1f} {t_torch:>13.1f} {t_fp8:>8.1f} {bw:>9.1f} {share:>7} "
                  f"{t_bf16 / t_fp8:>7.2f}x {t_torch / t_fp8:>8.2f}x")
    print("\nscaled_mm (fp8 x fp8, row-wise scales, bf16 out)")
    print(f"{'M x N x K':>20} {'torch µs':>9} {'mps_ext µs':>11} {'speedup':>8}")
    for n, k in SHAPES[:3]:
        wq, ws = mps_ext.fp8.quantize(torch.randn(n, k, device="mps"), dim=1)
        for m in ROWS:
            aq, as_ = mps_ext.fp8.quantize(torch.randn(m, k, device="mps"), dim=1)
            b, sb = wq.t(), ws.t()
            t_ours = time_us(lambda: mps_ext.scaled_mm(aq, b, as_, sb))
            if torch215:
                sr = F.ScalingType.RowWise
                t_torch = time_us(lambda: F.scaled_mm(aq, b, as_, sr, sb, sr, output_dtype=torch.bfloat16))
                theirs = f"{t_torch:>9.1f}"
                ratio = f"{t_torch / t_ours:>7.2f}x"
            else:
                theirs, ratio = f"{'—':>9}", f"{'—':>8}"
            print(f"{f'{m}x{n}x{k}':>20} {theirs} {t_ours:>11.1f} {ratio}")


if __name__ == "__main__":
    main()
