"""Small-matrix linear algebra: mps_ext's kernels vs torch's own MPS ops, on an
Apple-silicon Mac.

Batches of 4096 3x3 and 4x4 solves (camera geometry, image warps), 1024 LU
factorizations and solves of order 16/32/64, 1024 triangular solves of
order 16/32/64 with 64 right-hand sides (the Gated DeltaNet shape among them),
and 4096 inverses and QR factorizations of order 3/4/16/32/64 (poses, Kalman
updates, orthogonalisation), those also against torch on the CPU (LAPACK on
the same batch, already in memory).
Reports microseconds per batched call and the speedup; where torch has no MPS
kernel (torch 2.13: linalg.lu_solve) its column says so.
Usage: python benchmarks/bench_linalg.py
"""

import argparse
import sys

import torch

import mps_ext
from _common import TIMING, Column, compare, main, time_us


def cases():
    def rand(*shape, dtype=torch.float32):
        return torch.randn(*shape, device="mps", dtype=dtype)

    for n in (3, 4):
        A, B = rand(4096, n, n) + n * torch.eye(n, device="mps"), rand(4096, n, 1)
        yield f"solve 4096 x {n}x{n}, 1 rhs", lambda A=A, B=B: torch.linalg.solve(A, B), \
            lambda A=A, B=B: mps_ext.solve(A, B)
    for n in (16, 32, 64):
        A, B = rand(1024, n, n) + n ** 0.5 * torch.eye(n, device="mps"), rand(1024, n, 8)
        yield f"lu_factor 1024 x {n}x{n}", lambda A=A: torch.linalg.lu_factor(A), lambda A=A: mps_ext.lu_factor(A)
        LU, pivots = mps_ext.lu_factor(A)
        yield f"lu_solve 1024 x {n}x{n}, 8 rhs", \
            lambda LU=LU, p=pivots, B=B: torch.linalg.lu_solve(LU, p, B), \
            lambda LU=LU, p=pivots, B=B: mps_ext.lu_solve(LU, p, B)
        T = torch.tril(rand(1024, n, n) * 0.05, -1) + torch.eye(n, device="mps")
        R = rand(1024, n, 64)
        yield f"solve_triangular 1024 x {n}x{n}, 64 rhs", \
            lambda T=T, R=R: torch.linalg.solve_triangular(T, R, upper=False, unitriangular=True), \
            lambda T=T, R=R: mps_ext.solve_triangular(T, R, upper=False, unitriangular=True)
    A = rand(1024, 8, 8, dtype=torch.complex64) + 3 * torch.eye(8, device="mps")
    B = rand(1024, 8, 1, dtype=torch.complex64)
    yield "solve 1024 x 8x8 complex64", lambda: torch.linalg.solve(A, B), lambda: mps_ext.solve(A, B)


def cpu_cases():
    """Cases also timed with torch on the CPU: (label, torch's op on mps, mps_ext's, torch's op on the CPU)."""
    for n in (3, 4, 16, 32, 64):
        A = torch.randn(4096, n, n) + n ** 0.5 * torch.eye(n)
        A_mps = A.to("mps")
        yield f"inv 4096 x {n}x{n}", lambda A=A_mps: torch.linalg.inv(A), lambda A=A_mps: mps_ext.inv(A), \
            lambda A=A: torch.linalg.inv(A)
        yield f"qr 4096 x {n}x{n}", lambda A=A_mps: torch.linalg.qr(A), lambda A=A_mps: mps_ext.qr(A), \
            lambda A=A: torch.linalg.qr(A)


TITLE = "small-matrix linear algebra, float32 (complex64 where noted)"
COLUMNS = [Column("case", "case", "", 40), *TIMING[:2], TIMING[4], Column("cpu_us", "torch cpu µs", ".1f", 13),
           Column("note", "note", "", 0)]


def parser() -> argparse.ArgumentParser:
    return argparse.ArgumentParser(description=__doc__.splitlines()[0])


def rows(args, chip):
    for label, theirs, ours in cases():
        yield compare(label, theirs, ours, check=False)
    for label, theirs, ours, cpu in cpu_cases():
        # QR is unique only up to signs, which torch's MPS kernel need not pick as LAPACK does (ours do: tested).
        yield compare(label, theirs, ours, check=not label.startswith("qr"),
                      cpu_us=time_us(cpu, warmup=2, iters=20, device="cpu"))


if __name__ == "__main__":
    main(sys.modules[__name__])
