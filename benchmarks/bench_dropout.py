"""Dropout as training calls it (F.dropout, nn.Dropout, inplace=True, and the backward), mps_ext's kernels vs
torch's own MPS ops, on an Apple-silicon Mac.

Before 2.15, torch's F.dropout on mps is its composite (bernoulli_, div_, mul: four passes) and inplace=True
is on every version; mps_ext runs one pass, which writes the bool mask the backward reads. The two draw
different masks: each row checks ours for its keep rate, not against torch's values. Reports microseconds,
effective bandwidth (the input read once, the output and the mask written once; the backward reads the
gradient and the mask and writes one gradient), its share of the chip's peak, and the speedup.
Usage: python benchmarks/bench_dropout.py [--dtype bf16 fp32]
"""

import argparse
import sys

import torch
import torch.nn.functional as F

from _common import TIMING, Column, compare, main, peak_gbps
from _media_cases import DROPOUT as CASES

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
TITLE = "dropout as training calls it"
COLUMNS = [Column("case", "case", "", 14), Column("call", "call", "", 10), Column("dtype", "dtype", "", 5), *TIMING]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtype", choices=list(DTYPES), nargs="+", default=["bf16", "fp32"])
    return p


def plausible(out: torch.Tensor, p: float) -> None:
    kept = float((out != 0).float().mean())
    assert abs(kept - (1 - p)) < 0.01, f"kept {kept:.4f} of the elements, not {1 - p}"


def rows(args, chip):
    peak = peak_gbps(chip)
    for label, shape, p in CASES:
        for dname in args.dtype:
            x = torch.randn(shape, device="mps", dtype=DTYPES[dname])
            y = x.clone()  # written over by the in-place calls
            mask = torch.rand(shape, device="mps") >= p
            n, size = x.numel(), x.element_size()

            def forward(x=x, p=p):
                return F.dropout(x, p)

            def inplace(y=y, p=p):
                return F.dropout(y, p, inplace=True)

            def backward(x=x, mask=mask, p=p):
                return torch.ops.aten.native_dropout_backward(x, mask, 1 / (1 - p))

            plausible(forward(), p)
            yield compare(f"{label} F.dropout {dname}", forward, forward, moved=n * (2 * size + 1), peak=peak,
                          check=False, case=label, call="F.dropout", dtype=dname)
            yield compare(f"{label} inplace {dname}", inplace, inplace, moved=n * (2 * size + 1), peak=peak,
                          check=False, case=label, call="inplace", dtype=dname)
            yield compare(f"{label} backward {dname}", backward, backward, moved=n * (2 * size + 1), peak=peak,
                          case=label, call="backward", dtype=dname)
            del x, y, mask
            torch.mps.empty_cache()


if __name__ == "__main__":
    main(sys.modules[__name__])
