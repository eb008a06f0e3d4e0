"""Shared pieces of the benchmarks: the chip and its peak bandwidth, timing on the GPU, the one measurement
of torch's op against mps_ext's, and the result tables.

Every benchmark module defines ``TITLE``, ``COLUMNS`` (a list of :class:`Column`), ``parser()`` and
``rows(args, chip)``, which yields one dict per measurement with at least ``case`` (a label) and
``speedup`` (torch's time over mps_ext's); ``main()`` prints them as a table, and ``python -m mps_ext bench``
(mps_ext/bench.py, which also defines the table format) collects them into JSON, Markdown and a plot.
"""

from __future__ import annotations

import contextlib
import sys
import time

import torch

import mps_ext
from mps_ext.bench import Column, print_table

# Peak DRAM bandwidth in GB/s by chip, from Apple's specifications.
PEAK_GBPS = {
    "M1": 68, "M1 Pro": 200, "M1 Max": 400, "M1 Ultra": 800,
    "M2": 100, "M2 Pro": 200, "M2 Max": 400, "M2 Ultra": 800,
    "M3": 100, "M3 Pro": 150, "M3 Max": 400, "M3 Ultra": 819,
    "M4": 120, "M4 Pro": 273, "M4 Max": 546,
}


# The columns every GPU benchmark reports after its own.
TIMING = [Column("torch_us", "torch µs", ".1f", 9), Column("mps_ext_us", "mps_ext µs", ".1f", 11),
          Column("gbps", "GB/s", ".1f", 7), Column("pct_peak", "% peak", ".1f", 7),
          Column("speedup", "speedup", ".2f", 8), Column("kernels", "kernel", "", 0)]


def mps_status() -> tuple[bool, str]:
    """Whether a real MPS device is usable here, and why not."""
    from mps_ext.testing import mps_usable

    return mps_usable()


def chip_name() -> str | None:
    """The GPU's name ("Apple M3 Max"), None without a usable one."""
    if not mps_status()[0]:
        return None
    return dict(mps_ext._C._metal_device_info()).get("name", "unknown")


def require_mps() -> str:
    """The GPU's name; exits 0 with a message when there is no usable MPS device."""
    usable, why = mps_status()
    if not usable:
        print(f"This benchmark needs an Apple-silicon GPU: {why}. Nothing to measure here.")
        sys.exit(0)
    return chip_name()


def peak_gbps(device_name: str | None) -> float | None:
    """Peak bandwidth of the chip named like "Apple M3 Max", if known (the longest matching name wins)."""
    name = (device_name or "").replace("Apple ", "")
    matches = [k for k in PEAK_GBPS if name.startswith(k)]
    return PEAK_GBPS[max(matches, key=len)] if matches else None


def time_us(fn, warmup: int = 10, iters: int = 100, device: str = "mps") -> float:
    """Median wall time of fn() in microseconds, synchronizing the GPU around each batch of 10 calls (nothing
    to wait for when ``device`` is "cpu")."""
    sync = torch.mps.synchronize if device == "mps" else lambda: None
    for _ in range(warmup):
        fn()
    sync()
    samples = []
    for _ in range(iters // 10):
        start = time.perf_counter()
        for _ in range(10):
            fn()
        sync()
        samples.append((time.perf_counter() - start) / 10 * 1e6)
    samples.sort()
    return samples[len(samples) // 2]


@contextlib.contextmanager
def torch_kernels():
    """torch's own kernels on mps inside the block (the overrides off), restored afterwards."""
    was = mps_ext.overrides.is_enabled("mps")
    mps_ext.overrides.disable("mps")
    try:
        yield
    finally:
        if was:
            mps_ext.overrides.enable("mps")


def _agree(got, want) -> bool:
    if isinstance(got, tuple):  # (Q, R), ...: each output
        return all(_agree(g, w) for g, w in zip(got, want, strict=True))
    got, want = got.float().cpu(), want.float().cpu()
    return (got - want).abs().max().item() <= 0.02 * want.abs().max().item() + 1e-3


def compare(case: str, theirs, ours, *, moved: int | None = None, peak: float | None = None, check: bool = True,
            **columns) -> dict:
    """Times torch's op ``theirs()`` (the overrides off) and mps_ext's ``ours()``, checks that they agree
    (within 2% of the largest value), and returns the row: ``columns``, ``case``, ``torch_us``,
    ``mps_ext_us``, ``speedup``, ``gbps`` and ``pct_peak`` (from ``moved`` bytes, the least the op must
    move) and ``kernels`` (the kernels ``ours`` dispatched). Where torch has no MPS kernel for the op,
    ``torch_us`` and ``speedup`` are None and ``note`` says why."""
    row = {"case": case, **columns}
    with torch_kernels():
        try:
            want = theirs()
            row["torch_us"] = time_us(theirs)
        except (RuntimeError, NotImplementedError) as e:  # no MPS kernel in this torch
            want, row["torch_us"] = None, None
            row["note"] = f"torch: {str(e).splitlines()[0][:80]}"
    with mps_ext.trace() as t:
        got = ours()
    if check and want is not None:
        assert _agree(got, want), f"{case}: mps_ext and torch disagree"
    row["mps_ext_us"] = time_us(ours)
    row["speedup"] = row["torch_us"] / row["mps_ext_us"] if row["torch_us"] else None
    row["gbps"] = moved / (row["mps_ext_us"] * 1e-6) / 1e9 if moved else None
    row["pct_peak"] = 100 * row["gbps"] / peak if moved and peak else None
    row["kernels"] = ", ".join(dict.fromkeys(t.names)) or "torch"
    return row


def main(module) -> None:
    """A benchmark script's ``main``: its arguments, then its table on this Mac's GPU."""
    args = module.parser().parse_args()
    chip = require_mps()
    peak = peak_gbps(chip)
    print(f"{chip}, peak {peak or '?'} GB/s, torch {torch.__version__}: {module.TITLE}")
    print_table(module.rows(args, chip), module.COLUMNS)
