"""``python -m mps_ext selftest``: every kernel this build ships, on each
backend available here, on small shapes, against torch on the CPU."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import math

import torch

from . import (_C, grouped_mm, inv_ex, linear, log_softmax, lu_factor_ex, lu_solve, qr, softmax, solve_ex,
               solve_triangular, streams, trace)
from .testing import TOLERANCES, conditioned_scale, max_error, mps_usable, reduction_scale

SHORT = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}
MSL_TYPE = {torch.float32: "float", torch.float16: "half", torch.bfloat16: "bfloat"}  # MSL names


@dataclass
class Case:
    name: str
    # (device) -> (result, reference on the CPU, tolerance scale[, absolute tolerance on top])
    run: Callable[[str], tuple]
    # (device) -> why the case cannot run there, or None; with the kernels it would have run.
    skip: Callable[[str], str | None] = lambda device: None
    kernels: tuple[str, ...] = ()


def softmax_cases() -> Iterator[Case]:
    ops = {"softmax": (softmax, torch.softmax), "log_softmax": (log_softmax, torch.log_softmax)}
    pairs = [(torch.float32, None), (torch.float16, None), (torch.bfloat16, None), (torch.float16, torch.float32),
             (torch.bfloat16, torch.float32)]
    shapes = [("simd", (11, 37), -1), ("simd", (9, 128), -1), ("simd", (13, 5), -1), ("block", (3, 129), -1), ("block", (2, 400), -1), ("split", (2, 5000), -1), ("strided", (2, 7, 600), 1),
              ("dim moved last", (2, 6, 5), 1)]
    for op, (ours, theirs) in ops.items():
        for dtype, out in pairs:
            for variant, shape, dim in shapes:
                def run(device, ours=ours, theirs=theirs, dtype=dtype, out=out, shape=shape, dim=dim):
                    x = (torch.randn(shape, generator=torch.Generator().manual_seed(0)) * 3).to(dtype)
                    got = ours(x.to(device), dim, dtype=out)
                    want = theirs(x, dim, dtype=torch.float32).to(out or dtype)
                    return got, want, reduction_scale(out or dtype, shape[dim], signed_terms=False)

                types = SHORT[dtype] + (f"->{SHORT[out]}" if out else "")
                yield Case(f"{op} {variant} {types} {tuple(shape)}", run)


def linear_cases() -> Iterator[Case]:
    # (variant, rows, out_features, in_features): every kernel, every row bucket (1, 2, 4, 8); one row of x
    # with enough rows of W to fill the simulated GPU (1024 SIMD groups) takes one row of W per SIMD group;
    # "t": W stored k-major (x @ W with W in_features x out_features, transformers' Conv1D), N past whole
    # 16-byte columns.
    shapes = [("dense", 1, 67, 100), ("dense", 1, 1030, 24), ("dense", 2, 67, 100), ("dense", 3, 33, 129),
              ("dense", 5, 9, 256),
              ("splitk", 1, 8, 3000), ("splitk", 2, 8, 3000), ("splitk", 4, 5, 2000), ("splitk", 8, 4, 2000),
              ("t", 1, 300, 70), ("t", 2, 67, 100), ("t", 3, 33, 129), ("t", 7, 9, 256)]
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for variant, rows, n, k in shapes:
            def run(device, dtype=dtype, rows=rows, n=n, k=k, k_major=variant == "t"):
                g = torch.Generator().manual_seed(rows * n * k)
                x, w, b = (torch.randn(s, generator=g).to(dtype) for s in ((rows, k), (n, k), (n,)))
                if k_major:
                    w = w.t().contiguous().t()
                got = linear(x.to(device), w.to(device), b.to(device))
                want = torch.nn.functional.linear(x.float(), w.float(), b.float()).to(dtype)
                return got, want, reduction_scale(dtype, k)

            yield Case(f"linear {variant} {SHORT[dtype]} {rows}x{k} @ {n}x{k}.T", run)


def _flat(*tensors: torch.Tensor) -> torch.Tensor:
    """Results as one float32 vector (complex as (re, im), pivots as floats: any difference fails)."""
    parts = [torch.view_as_real(t.cpu()) if t.is_complex() else t.cpu() for t in tensors]
    return torch.cat([p.flatten().float() for p in parts])


def linalg_cases() -> Iterator[Case]:
    for dtype, short in ((torch.float32, "f32"), (torch.complex64, "c64")):
        for n, kind in ((3, "thread"), (20, "simd")):
            def rand(*shape, seed=0, dtype=dtype):
                return torch.randn(*shape, dtype=dtype, generator=torch.Generator().manual_seed(seed))

            def factor(device, n=n, rand=rand):
                A = rand(16, n, n)
                LU, pivots, info = lu_factor_ex(A.to(device))
                return _flat(LU, pivots, info), _flat(*torch.linalg.lu_factor_ex(A)), conditioned_scale(A)

            def solve(device, n=n, rand=rand):
                A, B = rand(16, n, n), rand(16, n, 2, seed=1)
                got = solve_ex(A.to(device), B.to(device))
                return _flat(*got), _flat(*torch.linalg.solve_ex(A, B)), conditioned_scale(A)

            def lu_solve_adjoint(device, n=n, rand=rand):
                A, B = rand(16, n, n), rand(16, n, 2, seed=1)
                LU, pivots = torch.linalg.lu_factor(A)
                got = lu_solve(LU.to(device), pivots.to(device), B.to(device), adjoint=True)
                return _flat(got), _flat(torch.linalg.lu_solve(LU, pivots, B, adjoint=True)), conditioned_scale(A)

            def triangular(device, n=n, rand=rand):
                A = torch.tril(rand(4, n, n) * 0.1) + 2 * torch.eye(n)
                B = rand(4, n, 3, seed=1)
                got = solve_triangular(A.to(device), B.to(device), upper=False)
                return _flat(got), _flat(torch.linalg.solve_triangular(A, B, upper=False)), conditioned_scale(A)

            def inverse(device, n=n, rand=rand):
                A = rand(16, n, n)
                return _flat(*inv_ex(A.to(device))), _flat(*torch.linalg.inv_ex(A)), conditioned_scale(A)

            for label, run in (("lu_factor", factor), ("solve", solve), ("lu_solve adjoint", lu_solve_adjoint),
                               ("inv", inverse)):
                yield Case(f"{label} {kind} {short} {n}x{n}", run)
            yield Case(f"solve_triangular simd {short} {n}x{n}", triangular)
            if n <= 4:  # A shared by several right-hand sides: factor and solve run apart
                def shared(device, n=n, rand=rand):
                    A, B = rand(n, n), rand(5, n, 2, seed=1)
                    got, info = solve_ex(A.to(device), B.to(device))
                    return _flat(got, info), _flat(*torch.linalg.solve_ex(A, B)), conditioned_scale(A)

                yield Case(f"solve shared A {kind} {short} {n}x{n}", shared)

    def gated_deltanet(device):
        A = torch.tril(torch.randn(4, 64, 64, generator=torch.Generator().manual_seed(0)) * 0.05, -1)
        A += torch.eye(64)
        B = torch.randn(4, 64, 64, generator=torch.Generator().manual_seed(1))
        got = solve_triangular(A.to(device), B.to(device), upper=False, unitriangular=True)
        return got, torch.linalg.solve_triangular(A, B, upper=False, unitriangular=True), conditioned_scale(A)

    yield Case("solve_triangular inverse f32 64x64 unit", gated_deltanet)

    for dtype, short in ((torch.float32, "f32"), (torch.complex64, "c64")):
        def householder(device, dtype=dtype):
            A = torch.randn(8, 20, 13, dtype=dtype, generator=torch.Generator().manual_seed(0))
            return _flat(*qr(A.to(device))), _flat(*torch.linalg.qr(A)), conditioned_scale(A)

        yield Case(f"qr simd {short} 20x13", householder)  # geqrf, then the product of its reflectors


def stream_cases() -> Iterator[Case]:
    def run(device):
        # Kernels on a side stream ordered with the default stream by events both ways.
        x = torch.randn(4, 300, generator=torch.Generator().manual_seed(0))
        side, default = streams.Stream(device), streams.current_stream(device)
        side.wait_stream(default)
        with streams.stream(side):
            got = log_softmax(softmax(x.to(device), -1), -1)
        done = side.record_event()
        default.wait_event(done)
        done.synchronize()
        return got, torch.log_softmax(torch.softmax(x, -1), -1), reduction_scale(torch.float32, 300, signed_terms=True)

    yield Case("streams: side stream and events (4, 300)", run)


def fp8_cases() -> Iterator[Case]:
    # Integer operands (exact in e4m3fn up to 16) and power-of-two scales: every
    # product and sum is exact in float32, so results must match exactly.
    from . import fp8

    f8 = torch.float8_e4m3fn

    def ints(*shape, seed):
        return torch.randint(-16, 17, shape, generator=torch.Generator().manual_seed(seed)).float()

    def codes(q):  # e4m3fn values on the CPU, whatever the storage dtype
        q = q.cpu()
        return (q.view(f8) if q.dtype == torch.uint8 else q).float()

    for dtype in SHORT:
        def quantize(device, dtype=dtype):
            x = torch.randn(37, 70, generator=torch.Generator().manual_seed(1)).to(dtype)
            q, _ = fp8.quantize(x.to(device), block=(16, 32))
            padded = torch.zeros(48, 96)
            padded[:37, :70] = x.float().abs()
            amax = padded.view(3, 16, 3, 32).amax((1, 3))
            scale = torch.where(amax == 0, 1.0, amax / 448).repeat_interleave(16, 0).repeat_interleave(32, 1)
            return codes(q), (x.float() / scale[:37, :70]).to(f8).float(), 1.0

        def dequantize(device, dtype=dtype):
            q = ints(9, 40, seed=2).to(f8)
            s = torch.tensor([[0.5], [2.0], [0.25]])
            got = fp8.dequantize(q.to(device) if device == "cpu" else q.view(torch.uint8).to(device), s.to(device),
                                 dtype=dtype, block=(3, 40))
            return got, (q.float() * s.repeat_interleave(3, 0)).to(dtype), 1.0

        def scaled_mm(device, dtype=dtype, m=3, k=72):
            a, w = ints(m, k, seed=3).to(f8), ints(40, k, seed=4).to(f8)
            sa, sb = torch.full((m, 1), 0.5), torch.full((1, 40), 2.0)
            dev = [t.view(torch.uint8).to(device) for t in (a, w)]
            got = fp8.scaled_mm(dev[0], dev[1].t(), sa.to(device), sb.to(device), out_dtype=dtype)
            return got, ((a.float() * sa) @ (w.float().t() * sb)).to(dtype), 1.0

        def fp8_linear(device, dtype=dtype, m=3):
            x, w = ints(m, 72, seed=5).to(dtype), ints(40, 72, seed=6).to(f8)
            s = torch.tensor([[0.5, 2.0, 0.25], [1.0, 4.0, 0.5]])
            got = fp8.fp8_linear(x.to(device), w.view(torch.uint8).to(device), s.to(device), block_size=(32, 32))
            full = s.repeat_interleave(32, 0).repeat_interleave(32, 1)[:40, :72]
            return got, (x.float() @ (w.float() * full).t()).to(dtype), 1.0

        # One row with K past what a threadgroup holds in registers (16384): the gemv splits it over SIMD
        # groups, with a whole chunk and a tail past its steps
        def fp8_linear_split(device, dtype=dtype):
            x, w = ints(1, 16500, seed=9).to(dtype), ints(8, 16500, seed=10).to(f8)
            got = fp8.fp8_linear(x.to(device), w.view(torch.uint8).to(device), torch.tensor(0.5).to(device))
            return got, (x.float() @ (w.float() * 0.5).t()).to(dtype), 1.0

        def grouped(device, dtype=dtype, ends=(1, 2, 3), block=None, k=72):
            x, w = ints(ends[-1], k, seed=9).to(dtype), ints(3, 24, k, seed=10).to(f8)
            powers = torch.tensor([0.5, 2.0, 0.25, 1.0])
            if block:  # blocks of 16 x 32: 2 x ceil(k / 32) per expert
                cols = -(-k // 32)
                s = powers.repeat(2 * cols)[:6 * cols].view(3, 2, cols)
                full = s.repeat_interleave(16, 1).repeat_interleave(32, 2)[:, :24, :k]
            else:
                s = powers.repeat(18).view(3, 24)
                full = s[..., None]
            offs = torch.tensor(ends, dtype=torch.int32)
            got = fp8.fp8_grouped_mm(x.to(device), w.view(torch.uint8).to(device), s.to(device), offs.to(device),
                                     block_size=block)
            return got, torch._grouped_mm(x.float(), (w.float() * full).transpose(-2, -1), offs=offs).to(dtype), 1.0

        t = SHORT[dtype]
        yield Case(f"fp8 quantize {t} (37, 70) blocks 16x32", quantize)
        yield Case(f"fp8_linear gemv split K {t} 1x16500x8", fp8_linear_split)
        yield Case(f"scaled_mm gemv split K fp8->{t} 1x16500x40", lambda d, f=scaled_mm: f(d, m=1, k=16500))
        # One row per expert streams, a lane reading 8 bytes of a weight row per step (K = 72) or 16 (K = 512);
        # more rows, or a K past 32 SIMD groups, take the decode pipeline for the rows an expert has on average
        # (at least two). Per channel and in blocks.
        for k, bytes_ in ((72, 8), (512, 16)):
            yield Case(f"fp8_grouped_mm stream{bytes_} {t} 3x{k}x24x3", lambda d, f=grouped, k=k: f(d, k=k))
            yield Case(f"fp8_grouped_mm stream{bytes_} {t} blocks 16x32 3x{k}x24x3",
                       lambda d, f=grouped, k=k: f(d, block=(16, 32), k=k))
        yield Case(f"fp8_grouped_mm decode_m2 {t} 3x16500x24x3", lambda d, f=grouped: f(d, k=16500))  # too long to stream
        for ends, rows in (((4, 4, 12), 4), ((8, 8, 24), 8)):
            yield Case(f"fp8_grouped_mm decode_m{rows} {t} {ends[-1]}x72x24x3",
                       lambda d, f=grouped, ends=ends: f(d, ends=ends))
            yield Case(f"fp8_grouped_mm decode_m{rows} {t} blocks 16x32 {ends[-1]}x72x24x3",
                       lambda d, f=grouped, ends=ends: f(d, ends=ends, block=(16, 32)))
        # Prefill: tiles as tall as the rows an expert has on average.
        for ends, rows in (((10, 20, 30), 16), ((20, 40, 60), 32), ((40, 80, 120), 64)):
            yield Case(f"fp8_grouped_mm tiled_m{rows} {t} blocks 16x32 {ends[-1]}x72x24x3",
                       lambda d, f=grouped, ends=ends: f(d, ends=ends, block=(16, 32)))
        yield Case(f"fp8 dequantize ->{t} (9, 40)", dequantize)
        for m in (1, 2, 3, 8, 33):  # gemv_stream for one row, gemv for 2, 4 and 8, tiled
            kind = "tiled" if m > 8 else "gemv_stream" if m == 1 else "gemv"
            yield Case(f"scaled_mm {kind} fp8->{t} {m}x72x40", lambda d, f=scaled_mm, m=m: f(d, m=m))
            yield Case(f"fp8_linear {kind} {t} {m}x72x40", lambda d, f=fp8_linear, m=m: f(d, m=m))

    # float8 outputs (divided by scale_result 4: still exact), e5m2 operands; values past 448 saturate e4m3fn.
    def float8_out(device, out):
        a, w = ints(3, 72, seed=7).to(torch.float8_e5m2), ints(40, 72, seed=8).to(f8)
        sa, sb, sr = torch.tensor(2.0), torch.tensor(1.0), torch.tensor(4.0)
        got = fp8.scaled_mm(a.to(device), w.view(torch.uint8).to(device).t(), sa.to(device), sb.to(device),
                            out_dtype=out, scale_result=sr.to(device))
        want = ((a.float() * sa) @ (w.float().t() * sb) / sr).to(out)
        return codes(got) if out == f8 else got.cpu().float(), want.float(), 1.0

    for out, name in ((f8, "fp8"), (torch.float8_e5m2, "e5m2")):
        yield Case(f"scaled_mm e5m2 x e4m3fn ->{name} 3x72x40", lambda d, out=out: float8_out(d, out),
                   skip=lambda d: None if fp8.storage_dtype(d) == f8 else "torch holds no float8 there",
                   kernels=(f"scaled_mm_encode_{name}",))


def grouped_mm_cases() -> Iterator[Case]:
    # Small integers: exact in every dtype, so any wrong element shows. Every
    # group layout, both layouts of b and all tile heights; offs[-1] covers
    # the split dimension (torch leaves positions past it unwritten).
    # Decode pipelines by the rows an active group has on average: m rows over min(m, groups) groups, at
    # least two (runs of one row take the 2-row kernel's 1-row branch); one row of each batch of a 3D a
    # (no offs: ends None) takes the 1-row kernel. b stored (G, K, N) decodes along N (decode_kn), with the
    # same pipelines, or takes tiles from 9 rows per group on average.
    shapes = [("decode_m1 3Dx3D", (3, 1, 40), (3, 24, 40), True, None),
              ("decode_m2", (3, 40), (8, 24, 40), True, [1, 2, 3, 3, 3, 3, 3, 3]),
              ("decode_m2 two rows", (6, 40), (3, 24, 40), True, [2, 2, 6]),
              ("decode_m4", (12, 40), (3, 24, 40), True, [4, 4, 12]),
              ("decode_m8", (24, 40), (3, 24, 40), True, [8, 8, 24]),
              ("decode_kn_m1 3Dx3D", (3, 1, 40), (3, 40, 24), False, None),
              ("decode_kn_m2", (3, 40), (8, 40, 24), False, [1, 2, 3, 3, 3, 3, 3, 3]),
              ("decode_kn_m4", (12, 40), (3, 40, 24), False, [4, 4, 12]),
              ("decode_kn_m8", (24, 40), (3, 40, 24), False, [8, 8, 24]),
              ("tiled_m16", (30, 40), (3, 40, 24), False, [10, 10, 30]),
              ("tiled_m32 3Dx2D", (3, 20, 40), (40, 24), False, [8, 8, 24]),
              ("tiled_m64 2Dx2D", (40, 48), (48, 24), False, [16, 16, 48])]
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for variant, a_shape, b_shape, transposed, ends in shapes:
            def run(device, dtype=dtype, a_shape=a_shape, b_shape=b_shape, transposed=transposed, ends=ends):
                g = torch.Generator().manual_seed(len(a_shape) * 10 + len(b_shape))
                a, b = (torch.randint(-2, 3, s, generator=g).to(dtype) for s in (a_shape, b_shape))
                b = b.transpose(-2, -1) if transposed else b
                offs = None if ends is None else torch.tensor(ends, dtype=torch.int32)
                got = grouped_mm(a.to(device), b.to(device), None if offs is None else offs.to(device))
                return got, torch._grouped_mm(a.float(), b.float(), offs=offs).to(dtype), 1.0

            yield Case(f"grouped_mm {variant} {SHORT[dtype]}", run)


def pad_cases() -> Iterator[Case]:
    # F.pad with the overrides on: every mode at every element size (the forward kernels move bytes), a
    # 16-byte-aligned row (one load and store per chunk) and an unaligned one; backward in each type.
    from torch.nn import functional as F

    from . import overrides

    sizes = {1: torch.uint8, 2: torch.bfloat16, 4: torch.float32, 8: torch.int64, 16: torch.complex128}
    names = {1: "uchar", 2: "ushort", 4: "uint", 8: "ulong", 16: "uint4"}
    for mode in ("constant", "reflect", "replicate"):
        for size, dtype in sizes.items():
            for pad in ((16 // size, 3, 2, 1), (1, 2, 0, 3)):
                def run(device, mode=mode, dtype=dtype, pad=pad):
                    x = (torch.randn(2, 3, 5, 24, generator=torch.Generator().manual_seed(1)) * 50).to(dtype)
                    with overrides.enabled(device):
                        got = F.pad(x.to(device), pad, mode=mode)
                    return _flat(got), _flat(F.pad(x, pad, mode=mode)), 1.0

                kernel = f"pad_{mode}_{names[size]}"
                yield Case(f"pad {mode} {str(dtype)[6:]} {pad}", run, kernels=(kernel,),
                           skip=lambda d, dtype=dtype: "mps holds no complex128" if d == "mps" and
                           dtype == torch.complex128 else None)
        if mode == "constant":
            continue
        for dtype, name in ((torch.float32, "f32"), (torch.float16, "f16"), (torch.bfloat16, "bf16"),
                            (torch.complex64, "c64")):
            def backward(device, mode=mode, dtype=dtype):
                g = torch.Generator().manual_seed(2)
                x = torch.randn(2, 3, 5, 9, generator=g).to(dtype)
                dy = torch.randn(2, 3, 8, 14, generator=g).to(dtype)
                # The backward op itself, not autograd: the emulated GPU has no device the engine can run on.
                op = getattr(torch.ops.aten, f"{'reflection' if mode == 'reflect' else 'replication'}_pad2d_backward")
                with overrides.enabled(device):
                    got = op(dy.to(device), x.to(device), (2, 3, 1, 2))
                xw = x.to(torch.complex128 if dtype.is_complex else torch.float64).detach().requires_grad_()
                F.pad(xw, (2, 3, 1, 2), mode=mode).backward(dy.to(xw.dtype))
                return _flat(got), _flat(xw.grad.to(dtype)), 4.0

            yield Case(f"pad backward {mode} {name} (2, 3, 5, 9)", backward)


def upsample_cases() -> Iterator[Case]:
    # F.interpolate with the overrides on, in 1, 2 and 3 dimensions: nearest and nearest-exact at every element
    # size they move (uint8, bfloat16, float32), linear and cubic in each float type, and each mode's backward in
    # each type, against torch (linear and cubic rounded from float32, gradients from float64).
    from torch.nn import functional as F

    from . import overrides

    def rand(shape, dtype, seed):
        g = torch.Generator().manual_seed(seed)
        if dtype == torch.uint8:
            return torch.randint(0, 256, shape, generator=g, dtype=torch.uint8)
        return torch.randn(shape, generator=g).to(dtype)

    shapes = {1: (2, 3, 7), 2: (2, 3, 5, 7), 3: (1, 3, 3, 5, 4)}
    sizes = {1: [11], 2: [8, 11], 3: [5, 7, 6]}
    smooth = {1: ("linear",), 2: ("bilinear", "bicubic"), 3: ("trilinear",)}
    names = {torch.uint8: "uchar", torch.bfloat16: "ushort", torch.float32: "uint"}
    short = {torch.uint8: "u8", **SHORT}
    for dims, shape in shapes.items():
        for mode in ("nearest", "nearest-exact"):
            for dtype, bytes_type in names.items():
                def run(device, mode=mode, dtype=dtype, shape=shape):
                    x = rand(shape, dtype, 1)
                    with overrides.enabled(device):
                        got = F.interpolate(x.to(device), scale_factor=1.7, mode=mode)
                    return _flat(got), _flat(F.interpolate(x, scale_factor=1.7, mode=mode)), 1.0

                kernel = f"upsample_{mode.replace('-', '_')}_{bytes_type}_{dims}d"
                yield Case(f"upsample {mode} {short[dtype]} {shape}", run, kernels=(kernel,))
        # Each element copied 2^k times along every dimension, 16-byte runs aligned: the repeat kernels, rows
        # doubled inside a run (pairs) where channels come first; the same size in 1-D (a copy), channels last
        # (16 channels are whole runs in every element size) in 2-D and 3-D.
        row, last = (*shape[:-1], 16), (shape[0], 16, *shape[2:])
        repeats = [("pairs", row, 2.0), ("", row, 1.0) if dims == 1 else ("", last, 2.0)]
        for kind, repeat_shape, factor in repeats:
            for dtype, bytes_type in names.items():
                def run(device, dtype=dtype, shape=repeat_shape, factor=factor, last=kind == "" and dims > 1):
                    x = rand(shape, dtype, 5)
                    if last:
                        x = x.contiguous(memory_format=torch.channels_last if x.dim() == 4 else torch.channels_last_3d)
                    with overrides.enabled(device):
                        got = F.interpolate(x.to(device), scale_factor=factor, mode="nearest-exact")
                    return _flat(got), _flat(F.interpolate(x, scale_factor=factor, mode="nearest-exact")), 1.0

                kernel = f"upsample_repeat{'_' + kind if kind else ''}_{bytes_type}_{dims}d"
                yield Case(f"upsample repeat{' ' + kind if kind else ''} {short[dtype]} {repeat_shape}", run,
                           kernels=(kernel,))
        for mode in smooth[dims]:
            for dtype in (torch.float32, torch.float16, torch.bfloat16):
                def run(device, mode=mode, dtype=dtype, shape=shape):
                    x = rand(shape, dtype, 2)
                    with overrides.enabled(device):
                        got = F.interpolate(x.to(device), scale_factor=1.7, mode=mode)
                    return got, F.interpolate(x.float(), scale_factor=1.7, mode=mode).to(dtype), 2.0

                yield Case(f"upsample {mode} {SHORT[dtype]} {shape}", run)
        for mode in ("nearest", "nearest-exact", *smooth[dims]):
            # The backward op itself, not autograd: the emulated GPU has no device the engine can run on.
            prefix = {"nearest": "upsample_nearest", "nearest-exact": "_upsample_nearest_exact"}
            op = getattr(torch.ops.aten, f"{prefix.get(mode, 'upsample_' + mode)}{dims}d_backward")
            flag = () if mode.startswith("nearest") else (False,)
            for dtype in (torch.float32, torch.float16, torch.bfloat16):
                def backward(device, mode=mode, dtype=dtype, shape=shape, dims=dims, op=op, flag=flag):
                    out_shape = (*shape[:2], *sizes[dims])
                    x, dy = rand(shape, dtype, 3), rand(out_shape, dtype, 4)
                    with overrides.enabled(device):
                        got = op(dy.to(device), sizes[dims], list(shape), *flag, *[None] * dims)
                    xw = x.double().requires_grad_()
                    F.interpolate(xw, size=sizes[dims], mode=mode).backward(dy.double())
                    return got, xw.grad.to(dtype), 4.0

                yield Case(f"upsample backward {mode} {SHORT[dtype]} {shape}", backward)


def dropout_cases() -> Iterator[Case]:
    # native_dropout and its backward with the overrides on (the ops themselves: the emulated GPU has no
    # device autograd can run on). The mask is the kernels' own draw, not torch's: the output must be
    # torch's arithmetic on the returned mask, and the mask keep a plausible share.
    from . import overrides

    def plausible(mask: torch.Tensor, p: float) -> torch.Tensor:
        n, kept = mask.numel(), int(mask.sum())
        return torch.tensor(float(abs(kept - n * (1 - p)) < 6 * (n * p * (1 - p)) ** 0.5))

    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        def forward(device, dtype=dtype, p=0.3):
            x = torch.randn(37, 101, generator=torch.Generator().manual_seed(1)).to(dtype)
            with overrides.enabled(device):
                out, mask = torch.native_dropout(x.to(device), p, True)
            mask = mask.cpu()
            return _flat(out, plausible(mask, p)), _flat(x.mul(mask).mul_(1 / (1 - p)), torch.tensor(1.0)), 1.0

        def backward(device, dtype=dtype):
            g = torch.Generator().manual_seed(2)
            dy, mask = torch.randn(37, 101, generator=g).to(dtype), torch.rand(37, 101, generator=g) > 0.4
            with overrides.enabled(device):
                got = torch.ops.aten.native_dropout_backward(dy.to(device), mask.to(device), 2.5)
            return got, dy.mul(mask).mul_(2.5), 1.0

        yield Case(f"dropout {SHORT[dtype]} (37, 101) p=0.3", forward)
        yield Case(f"dropout backward {SHORT[dtype]} (37, 101)", backward)


def _attention_reference(q, k, v, mask, causal, sinks, window):
    """Attention by its definition (GQA heads repeated): the scores, causal (top-left) and a sliding window
    aligned to the end of the keys as -inf, the mask added, a sink column, softmax, the column dropped."""
    k, v = (t.repeat_interleave(q.size(-3) // t.size(-3), -3) for t in (k, v))
    scores = q @ k.transpose(-2, -1) / q.size(-1) ** 0.5
    row, key = torch.arange(q.size(-2))[:, None], torch.arange(k.size(-2))
    pos = row + k.size(-2) - q.size(-2)
    excluded = (key > row) & causal
    if window:
        excluded |= (key > pos) | (key <= pos - window)
    scores = scores.masked_fill(excluded, -math.inf) + (0.0 if mask is None else mask.double())
    if sinks is not None:
        scores = torch.cat([scores, sinks.double().reshape(-1, 1, 1).expand(*scores.shape[:-1], 1)], -1)
    return torch.softmax(scores, -1)[..., :k.size(-2)] @ v


def attention_cases() -> Iterator[Case]:
    # Attention with the overrides on, decode shapes: every dtype, every head-dim slice
    # (2, 4, 6, 8 elements per lane: head dims 40, 80, 192 with values of 128, 256) and every row block (query
    # heads per KV head x query rows: 1, 2, 4, 8); the 8-row cases have keys enough to split them over
    # threadgroups and run the merge. Masks vary with the block: none, bool, float32, the query's dtype with
    # causal.
    from torch.nn import functional as F

    from . import overrides

    dims = {2: (40, 40), 4: (80, 80), 6: (192, 128), 8: (256, 256)}
    blocks = {1: (1, 1, 37), 2: (2, 1, 37), 4: (2, 2, 37), 8: (4, 2, 150)}  # rows: (group, query rows, keys)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for e, (dim, v_dim) in dims.items():
            for rows, (group, q_len, keys) in blocks.items():
                def run(device, dtype=dtype, dim=dim, v_dim=v_dim, rows=rows, group=group, q_len=q_len, keys=keys):
                    g = torch.Generator().manual_seed(rows * dim)
                    q = torch.randn(1, 2 * group, q_len, dim, generator=g).to(dtype)
                    k = torch.randn(1, 2, keys, dim, generator=g).to(dtype)
                    v = torch.randn(1, 2, keys, v_dim, generator=g).to(dtype)
                    mask = {1: None, 2: torch.rand(q_len, keys, generator=g) > 0.3,
                            4: torch.randn(1, 1, q_len, keys, generator=g),
                            8: torch.randn(1, 2 * group, q_len, keys, generator=g).to(dtype)}[rows]
                    causal = rows == 8 and dim == v_dim  # torch raises for both on its math path (dims unequal)
                    # The op F.scaled_dot_product_attention calls on mps, directly: the emulated GPU has no
                    # backend choice for torch's composite to make.
                    with overrides.enabled(device):
                        got, _ = torch.ops.aten._scaled_dot_product_attention_math_for_mps(
                            q.to(device), k.to(device), v.to(device), None if mask is None else mask.to(device),
                            0.0, causal, enable_gqa=True)
                    wide = None if mask is None or mask.dtype == torch.bool else mask.double()
                    want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(),
                                                          attn_mask=mask if wide is None else wide,
                                                          is_causal=causal, enable_gqa=True)
                    return got, want.to(dtype), reduction_scale(dtype, dim) * 2

                kernels = (f"attention_decode_{MSL_TYPE[dtype]}_e{e}_r{rows}",)
                if rows == 8:
                    kernels += (f"attention_merge_{MSL_TYPE[dtype]}_e{e}",)
                yield Case(f"attention {SHORT[dtype]} d{dim}/{v_dim} {group}x{q_len} rows, {keys} keys", run,
                           kernels=kernels)
    # Prefill through mps_ext's own op: every dtype and prefill head dim (D 32 to 256, values of their own),
    # a block and a bit of rows; causal, a float mask, a sliding window with sinks in turn.
    prefill_dims = {32: (24, 32), 64: (64, 64), 96: (80, 72), 128: (128, 128), 160: (160, 160), 192: (192, 128),
                    256: (256, 256)}
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for i, (d, (dim, v_dim)) in enumerate(prefill_dims.items()):
            def prefill(device, dtype=dtype, dim=dim, v_dim=v_dim, kind=i % 3):
                from ._ops import scaled_dot_product_attention

                g = torch.Generator().manual_seed(dim + v_dim)
                q = torch.randn(1, 4, 37, dim, generator=g).to(dtype)
                k = torch.randn(1, 2, 45, dim, generator=g).to(dtype)
                v = torch.randn(1, 2, 45, v_dim, generator=g).to(dtype)
                mask = torch.randn(37, 45, generator=g) if kind == 1 else None
                sinks = torch.randn(4, generator=g) if kind == 2 else None
                args = dict(attn_mask=mask, is_causal=kind == 0, enable_gqa=True, sinks=sinks,
                            window=9 if kind == 2 else None)
                got = scaled_dot_product_attention(*(t.to(device) for t in (q, k, v)),
                                                   **{n: a.to(device) if isinstance(a, torch.Tensor) else a
                                                      for n, a in args.items()})
                want = _attention_reference(q.double(), k.double(), v.double(), mask, kind == 0, sinks,
                                            9 if kind == 2 else None)
                return got, want.to(dtype), reduction_scale(dtype, dim) * 2

            kind = ("causal", "float mask", "window and sinks")[i % 3]
            yield Case(f"attention prefill {SHORT[dtype]} d{dim}/{v_dim} 37 rows, 45 keys, {kind}", prefill,
                       kernels=(f"attention_prefill_{MSL_TYPE[dtype]}_d{d}",))

    # Training: the forward that saves the log-sum-exp and the backward (dq, dk, dv and the sinks' gradient), the
    # ops themselves (the emulated GPU has no device autograd's engine can run on), every dtype and backward head
    # dim, GQA, causal or a window with sinks in turn; against float64 autograd of the definition.
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for i, (d, (dim, v_dim)) in enumerate(list(prefill_dims.items())[:4]):
            def training(device, dtype=dtype, dim=dim, v_dim=v_dim, windowed=i % 2 == 1):
                g = torch.Generator().manual_seed(3 * dim + v_dim)
                q = torch.randn(1, 4, 37, dim, generator=g).to(dtype)
                k = torch.randn(1, 2, 45, dim, generator=g).to(dtype)
                v = torch.randn(1, 2, 45, v_dim, generator=g).to(dtype)
                dout = torch.randn(1, 4, 37, v_dim, generator=g).to(dtype)
                sinks = torch.randn(4, generator=g) if windowed else None
                window, causal = (9, False) if windowed else (0, True)
                on = [t.to(device) for t in (q, k, v)]
                s_on = None if sinks is None else sinks.to(device)
                out, stats = torch.ops.mps_ext._scaled_dot_product_attention_training(
                    *on, None, causal, None, True, s_on, window, 0.0)
                grads = torch.ops.mps_ext._scaled_dot_product_attention_training_backward(
                    dout.to(device), *on, out, stats, None, causal, None, True, s_on, window, 0.0)
                wide = [t.double().requires_grad_() for t in (q, k, v)] + \
                    ([] if sinks is None else [sinks.double().requires_grad_()])
                ref = _attention_reference(*wide[:3], None, causal, wide[3] if sinks is not None else None, window)
                want = torch.autograd.grad(ref, wide, dout.double())
                got = [t for t in grads if t is not None and t.numel()]
                want = torch.cat([ref.detach().flatten()] + [t.flatten() for t in want])
                # Sums of products of the rounded inputs and output (delta = dout . out): within a few of the
                # dtype's epsilons of the largest gradient, however small an element comes out.
                floor = 4 * TOLERANCES[dtype][0] * float(want.abs().max())
                return (torch.cat([out.flatten()] + [t.flatten().to(dtype) for t in got]), want.to(dtype),
                        reduction_scale(dtype, 45) * 4, floor)

            kind = "window and sinks" if i % 2 else "causal"
            yield Case(f"attention training {SHORT[dtype]} d{dim}/{v_dim} 37 rows, 45 keys, {kind}", training,
                       kernels=tuple(f"attention_{stage}_{MSL_TYPE[dtype]}_d{d}"
                                     for stage in ("prefill", "backward_dq", "backward_dkv")))


def cases() -> list[Case]:
    return [*softmax_cases(), *linear_cases(), *fp8_cases(), *grouped_mm_cases(), *linalg_cases(), *pad_cases(),
            *upsample_cases(), *dropout_cases(), *attention_cases(), *stream_cases()]


def verify(case: Case, device: str) -> tuple[bool, float, list[str], set[str]]:
    """Runs ``case`` on ``device``: whether it matches torch within the dtype's tolerance, the largest error,
    the kernels it ran and the backends they ran on."""
    with trace() as t:
        got, want, scale, *floor = case.run(device)
    rtol, atol = TOLERANCES[got.dtype]
    good = bool(torch.isclose(got.cpu().double(), want.double(), rtol=rtol * scale, atol=atol * scale + sum(floor),
                              equal_nan=True).all())
    return good, max_error(got, want), t.names, {k.backend for k in t.kernels}


def run(out=print) -> bool:
    """Runs every case on every usable backend; prints a table; True if all pass and every kernel ran."""
    devices = [("simulator", "cpu")]
    usable, why = mps_usable()
    if usable:
        devices.append(("metal", "mps"))
    else:
        out(f"metal: skipped ({why})")
    ok = True
    out(f"{'backend':<10} {'case':<42} {'max |err|':>10}  result  kernels")
    for backend, device in devices:
        ran: set[str] = set()
        for case in cases():
            why = case.skip(device)
            if why:
                ran.update(case.kernels)
                out(f"{backend:<10} {case.name:<42} {'':>10}  skip    {why}")
                continue
            good, err, names, backends = verify(case, device)
            good &= backends <= {backend}
            ran.update(names)
            ok &= good
            out(f"{backend:<10} {case.name:<42} {err:>10.2e}  {'ok' if good else 'FAIL':<6}  {', '.join(names)}")
        missing = sorted(set(_C._sim_builtin_kernels()) - ran)
        if missing:
            ok = False
            out(f"{backend}: kernels no case ran: {', '.join(missing)}")
    return ok
