"""Shared pieces of the benchmarks: timing on the GPU and the chip's peak bandwidth."""

from __future__ import annotations

import sys
import time

import torch

# Peak DRAM bandwidth in GB/s by chip, from Apple's specifications.
PEAK_GBPS = {
    "M1": 68, "M1 Pro": 200, "M1 Max": 400, "M1 Ultra": 800,
    "M2": 100, "M2 Pro": 200, "M2 Max": 400, "M2 Ultra": 800,
    "M3": 100, "M3 Pro": 150, "M3 Max": 400, "M3 Ultra": 819,
    "M4": 120, "M4 Pro": 273, "M4 Max": 546,
}


def require_mps() -> str:
    """The GPU's name; exits 0 with a message when there is no usable MPS device."""
    from mps_ext import _C
    from mps_ext.testing import mps_usable

    usable, why = mps_usable()
    if not usable:
        print(f"This benchmark needs an Apple-silicon GPU: {why}. Nothing to measure here.")
        sys.exit(0)
    return dict(_C._metal_device_info()).get("name", "unknown")


def peak_gbps(device_name: str) -> float | None:
    """Peak bandwidth of the chip named like "Apple M3 Max", if known (the longest matching name wins)."""
    name = device_name.replace("Apple ", "")
    matches = [k for k in PEAK_GBPS if name.startswith(k)]
    return PEAK_GBPS[max(matches, key=len)] if matches else None


def time_us(fn, warmup: int = 10, iters: int = 100) -> float:
    """Median wall time of fn() on the GPU in microseconds, synchronizing around each batch of 10 calls."""
    for _ in range(warmup):
        fn()
    torch.mps.synchronize()
    samples = []
    for _ in range(iters // 10):
        start = time.perf_counter()
        for _ in range(10):
            fn()
        torch.mps.synchronize()
        samples.append((time.perf_counter() - start) / 10 * 1e6)
    samples.sort()
    return samples[len(samples) // 2]
