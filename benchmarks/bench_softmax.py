"""softmax / log_softmax over LLM vocabularies: mps_ext's kernels vs torch's own
MPS kernel, on an Apple-silicon Mac.

Reports microseconds, effective bandwidth (one read of the input and one
write of the output, the least any softmax must move), its share of the
chip's peak, and the speedup. Usage: python benchmarks/bench_softmax.py
"""

import argparse

import torch

import mps_ext
from _common import peak_gbps, require_mps, time_us

ROWS = (1, 4, 8)
VOCABS = (32000, 128256, 151936, 201088)
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--op", choices=["softmax", "log_softmax"], default="softmax")
    args = parser.parse_args()
    name = require_mps()
    peak = peak_gbps(name)
    ours = getattr(mps_ext, args.op)
    theirs = getattr(torch, args.op)
    print(f"{name}, peak {peak or '?'} GB/s, torch {torch.__version__}, op {args.op}")
    print(f"{'dtype':<5} {'shape':>12} {'torch µs':>9} {'mps_ext µs':>11} {'GB/s':>7} {'% peak':>7} {'speedup':>8}")
    for dname, dtype in DTYPES.items():
        for rows in ROWS:
            for vocab in VOCABS:
                x = torch.randn(rows, vocab, device="mps", dtype=dtype)
                mps_ext.overrides.disable("mps")  # torch's own kernel
                t_torch = time_us(lambda: theirs(x, -1))
                t_ours = time_us(lambda: ours(x, -1))
                gbps = 2 * x.numel() * x.element_size() / (t_ours * 1e-6) / 1e9
                share = f"{100 * gbps / peak:6.1f}%" if peak else "     ?"
                print(f"{dname:<5} {f'{rows}x{vocab}':>12} {t_torch:>9.1f} {t_ours:>11.1f} {gbps:>7.1f} {share:>7} "
                      f"{t_torch / t_ours:>7.2f}x")
    mps_ext.overrides.enable("mps")


if __name__ == "__main__":
    main()
