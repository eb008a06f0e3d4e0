"""The simulator's self-check: a few kernels, one per execution feature, run
in checked mode and compared with torch on the CPU."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from . import checked, compile_file


def _cases(lib):
    g = torch.Generator().manual_seed(0)

    def axpy():
        x, y = torch.randn(1000, generator=g), torch.randn(1000, generator=g)
        out = y.clone()
        lib.axpy(x, out, 2.5, threads=1000, group_size=256)
        return out, 2.5 * x + y

    def block_sum():
        x = torch.randn(3000, generator=g)
        sums = torch.zeros(3)
        lib.block_sum(x, sums, 3000, arg_casts={2: "int32"}, threads=3072, group_size=1024)
        return sums, torch.nn.functional.pad(x, (0, 72)).view(3, 1024).sum(1)

    def matmul32():
        a, b = torch.randn(32, 32, generator=g), torch.randn(32, 32, generator=g)
        c = torch.zeros(32, 32)
        lib.matmul32(a, b, c, threads=(128, 4), group_size=(32, 1))
        return c, a @ b

    def histogram():
        x = torch.randint(0, 1 << 20, (5000,), generator=g, dtype=torch.int32)
        bins = torch.zeros(16, dtype=torch.int32)
        lib.histogram(x, bins, threads=5000, group_size=128)
        return bins.float(), torch.bincount(x % 16, minlength=16).float()

    return [
        ("axpy", "non-uniform grid (partial last threadgroup)", axpy),
        ("block_sum", "threadgroup memory, barriers, simd_sum", block_sum),
        ("matmul32", "simdgroup_matrix load/multiply_accumulate/store", matmul32),
        ("histogram", "device atomics across worker threads", histogram),
    ]


def run(out=print) -> bool:
    """Run every self-check kernel in checked mode; print a table; True if all match torch."""
    lib = compile_file(Path(__file__).with_name("selfcheck.metal"))
    ok = True
    out(f"{'kernel':<11} {'exercises':<50} {'max |err|':>10} {'ms':>8}  result")
    with checked():
        for name, what, case in _cases(lib):
            start = time.perf_counter()
            got, want = case()
            ms = (time.perf_counter() - start) * 1e3
            err = (got - want).abs().max().item()
            good = err <= 1e-4 * max(1.0, want.abs().max().item())
            ok &= good
            out(f"{name:<11} {what:<50} {err:>10.2e} {ms:>8.1f}  {'ok' if good else 'FAIL'}")
    return ok
