"""Interpolation as image and video pipelines call it (F.interpolate: nearest, nearest-exact, bilinear, bicubic,
trilinear), mps_ext's kernels vs torch's own MPS op, on an Apple-silicon Mac.

Reports microseconds, effective bandwidth (one read of the input and one write of the output), its share of
the chip's peak, and the speedup. Usage: python benchmarks/bench_upsample.py [--dtype bf16 fp32]
"""

import argparse
import sys

import torch
import torch.nn.functional as F

from _common import TIMING, Column, compare, main, peak_gbps
from _media_cases import UPSAMPLE as CASES

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
TITLE = "interpolation as image and video pipelines call it"
COLUMNS = [Column("case", "case", "", 16), Column("mode", "mode", "", 13), Column("layout", "layout", "", 6),
           Column("dtype", "dtype", "", 5), *TIMING]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtype", choices=list(DTYPES), nargs="+", default=["bf16", "fp32"])
    return p


def rows(args, chip):
    peak = peak_gbps(chip)
    for label, shape, size, mode, channels_last in CASES:
        for dname in args.dtype:
            x = torch.randn(shape, device="mps", dtype=DTYPES[dname])
            if channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            out = F.interpolate(x, size=size, mode=mode)

            def run(x=x, size=size, mode=mode):
                return F.interpolate(x, size=size, mode=mode)

            layout = "NHWC" if channels_last else "NCHW"
            yield compare(f"{label} {mode} {layout} {dname}", run, run,
                          moved=(x.numel() + out.numel()) * x.element_size(), peak=peak, case=label, mode=mode,
                          layout=layout, dtype=dname)
            del x, out
            torch.mps.empty_cache()


if __name__ == "__main__":
    main(sys.modules[__name__])
