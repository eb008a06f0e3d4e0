"""Padding as image and video pipelines call it (F.pad: constant, reflect, replicate), mps_ext's kernels vs
torch's own MPS op, on an Apple-silicon Mac; and the driver memory torch's op keeps.

Reports microseconds, effective bandwidth (one read of the input and one write of the output), its share of
the chip's peak, and the speedup. On torch 2.13 and 2.14 torch's op is MPSGraph's padTensor, which corrupts
5-D frames of 65,536 elements or more: the rows of those shapes are timed without the agreement check and say
so. Usage: python benchmarks/bench_pad.py [--dtype bf16 fp32]
"""

import argparse
import sys

import torch
import torch.nn.functional as F

from _common import TIMING, Column, compare, main, peak_gbps
from _media_cases import PAD as CASES

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
TITLE = "padding as image and video pipelines call it"
COLUMNS = [Column("case", "case", "", 22), Column("mode", "mode", "", 9), Column("dtype", "dtype", "", 5),
           *TIMING]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtype", choices=list(DTYPES), nargs="+", default=["bf16", "fp32"])
    return p


def corrupted_by_mpsgraph(shape) -> bool:
    return len(shape) == 5 and shape[-1] * shape[-2] >= 65536 and torch.__version__ < "2.15"


def rows(args, chip):
    peak = peak_gbps(chip)
    for label, shape, pad, mode in CASES:
        for dname in args.dtype:
            x = torch.randn(shape, device="mps", dtype=DTYPES[dname])
            out = F.pad(x, pad, mode=mode)

            def run(x=x, pad=pad, mode=mode):
                return F.pad(x, pad, mode=mode)

            yield compare(f"{label} {mode} {dname}", run, run, moved=(x.numel() + out.numel()) * x.element_size(),
                          peak=peak, check=not corrupted_by_mpsgraph(shape), case=label, mode=mode, dtype=dname)
            del x, out
            torch.mps.empty_cache()


if __name__ == "__main__":
    main(sys.modules[__name__])
