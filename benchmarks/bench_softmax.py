"""softmax / log_softmax over LLM vocabularies: mps_ext's kernels vs torch's own
MPS kernel, on an Apple-silicon Mac.

Reports microseconds, effective bandwidth (one read of the input and one
write of the output, the least any softmax must move), its share of the
chip's peak, and the speedup. Usage: python benchmarks/bench_softmax.py [--op softmax log_softmax]
"""

import argparse
import sys

import torch

import mps_ext
from _common import TIMING, Column, compare, main, peak_gbps

ROWS = (1, 4, 8)
VOCABS = (32000, 128256, 151936, 201088)
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


TITLE = "softmax / log_softmax over LLM vocabularies"
COLUMNS = [Column("op", "op", "", 11), Column("dtype", "dtype", "", 5), Column("shape", "shape", "", 12), *TIMING]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--op", choices=["softmax", "log_softmax"], nargs="+", default=["softmax", "log_softmax"])
    return p


def rows(args, chip):
    peak = peak_gbps(chip)
    for op in args.op:
        ours, theirs = getattr(mps_ext, op), getattr(torch, op)
        for dname, dtype in DTYPES.items():
            for n in ROWS:
                for vocab in VOCABS:
                    x = torch.randn(n, vocab, device="mps", dtype=dtype)
                    yield compare(f"{op} {dname} {n}x{vocab}", lambda: theirs(x, -1), lambda: ours(x, -1),
                                  moved=2 * x.numel() * x.element_size(), peak=peak, op=op, dtype=dname,
                                  shape=f"{n}x{vocab}")


if __name__ == "__main__":
    main(sys.modules[__name__])
