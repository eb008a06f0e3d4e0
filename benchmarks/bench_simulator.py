"""How fast the Metal simulator runs the three realistic test kernels
(tests/kernels/{softmax,gemv,lu}.metal) compared with torch's own CPU ops.

The simulator is a testing tool, not a CPU backend: this shows what test
shapes cost. Usage: python benchmarks/bench_simulator.py [--repeat N]
"""

import argparse
import struct
import time
from pathlib import Path

import torch

import mps_ext.sim
from _common import Column, print_table

HERE = Path(__file__).resolve().parent
# Installed, setup.py puts the test kernels next to this script; in a checkout they are the tests'.
KERNELS = HERE / "kernels" if (HERE / "kernels").is_dir() else HERE.parent / "tests" / "kernels"


def best_ms(fn, repeat: int) -> float:
    fn()  # warm up (and compile)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


def cases():
    softmax = mps_ext.sim.compile_file(KERNELS / "softmax.metal")
    gemv = mps_ext.sim.compile_file(KERNELS / "gemv.metal")
    lu = mps_ext.sim.compile_file(KERNELS / "lu.metal")

    x = torch.randn(1, 151936)
    y = torch.empty_like(x)
    yield ("softmax 1x151936 fp32", lambda: softmax.softmax_float(x, y, struct.pack("<II", 1, 151936),
                                                                   threads=1024, group_size=1024),
           lambda: torch.softmax(x, -1))
    x8 = torch.randn(8, 32000)
    y8 = torch.empty_like(x8)
    yield ("softmax 8x32000 fp32", lambda: softmax.softmax_float(x8, y8, struct.pack("<II", 8, 32000),
                                                                  threads=8 * 1024, group_size=1024),
           lambda: torch.softmax(x8, -1))
    for dtype, name in ((torch.float32, "float"), (torch.float16, "half")):
        w, v, out = torch.randn(4096, 4096).to(dtype), torch.randn(4096).to(dtype), torch.empty(4096, dtype=dtype)
        kernel = getattr(gemv, f"gemv_{name}")
        yield (f"gemv 4096x4096 {name}", lambda kernel=kernel, w=w, v=v, out=out: kernel(
            w, v, out, out, struct.pack("<III", 4096, 4096, 0), threads=1024 * 128, group_size=128),
            lambda w=w, v=v: torch.nn.functional.linear(v, w))
    a = torch.randn(1000, 16, 16)
    piv, info = torch.empty(1000, 16, dtype=torch.int32), torch.empty(1000, dtype=torch.int32)
    yield ("lu 1000 x 16x16 fp32", lambda: lu.lu_factor(a.clone(), piv, info, struct.pack("<II", 16, 1000),
                                                         threads=16000, group_size=16),
           lambda: torch.linalg.lu_factor(a))


TITLE = "the Metal simulator running test kernels, against torch's CPU ops (a testing tool, not a CPU backend)"
COLUMNS = [Column("case", "case", "", 24), Column("simulator_ms", "simulator ms", ".2f", 13),
           Column("torch_cpu_ms", "torch cpu ms", ".3f", 13), Column("slowdown", "slowdown", ".0f", 9)]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=5)
    return p


def rows(args, chip=None):
    for name, sim, ref in cases():
        s, t = best_ms(sim, args.repeat), best_ms(ref, args.repeat)
        yield {"case": name, "simulator_ms": s, "torch_cpu_ms": t, "slowdown": s / t, "speedup": t / s}


def main():
    args = parser().parse_args()
    print(f"torch {torch.__version__}: {TITLE}")
    print_table(rows(args), COLUMNS)


if __name__ == "__main__":
    main()
