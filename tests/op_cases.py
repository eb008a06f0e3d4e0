"""Every mps_ext op in one table, for the tests that run a concern over all of
them (views and lazy bits, autograd in both modes, the differential fuzz test).

A case builds small inputs that the kernels take, names mps_ext's function and
the torch op it mirrors (torch ops computing the same where torch has none),
and which inputs are differentiable. Comparing with torch means torch's op on
the CPU with the overrides off.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

import mps_ext
from mps_ext import fp8
from tolerances import assert_close


def randn(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, dtype=dtype, generator=torch.Generator().manual_seed(seed))


def floating(outputs):
    """An op's floating and complex outputs (the ones with derivatives), as a list."""
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    return [o for o in outputs if o.is_floating_point() or o.is_complex()]


def well_conditioned(batch, n, dtype=torch.float32, seed=0):
    """U diag(s) V^H with Gaussian-random orthogonal/unitary U, V and s in [1, 10]: condition number <= 10, so
    solutions can be compared with a fixed tolerance; the entries (and so the pivots) are still random."""
    U, _ = torch.linalg.qr(randn(batch, n, n, dtype=dtype, seed=seed))
    V, _ = torch.linalg.qr(randn(batch, n, n, dtype=dtype, seed=seed + 1))
    s = 1 + 9 * torch.rand(batch, 1, n, generator=torch.Generator().manual_seed(seed + 2))
    return (U * s.to(dtype)) @ V.mH


def triangular(batch, n, dtype=torch.float32, seed=0):
    """Upper triangle well away from singular (small off-diagonal entries, diagonal +-1.5)."""
    A = randn(batch, n, n, dtype=dtype, seed=seed) / n
    A.diagonal(dim1=-2, dim2=-1).add_(torch.where(randn(batch, n, seed=seed + 1) > 0, 1.5, -1.5))
    return A.triu()


def fp8_weight(n, k, seed=0):
    """(N, K) e4m3fn weight with one float32 scale per output channel."""
    return fp8.quantize(randn(n, k, seed=seed), dim=1)


@dataclass
class Case:
    name: str
    make: Callable[[int], tuple]  # seed -> positional inputs
    ours: Callable  # mps_ext's function
    theirs: Callable  # torch's op with the same semantics (or torch ops computing it)
    differentiable: tuple[int, ...]  # indices of the inputs that have gradients and tangents
    scale: float = 1.0  # widens the tolerance of the output's dtype
    overridden: bool = True  # theirs is a torch op the overrides route to the kernels
    reference_jvp: Callable | None = None  # torch ops for the tangents, where theirs has no forward derivative
    reference_backward: Callable | None = None  # torch ops for the gradients, where theirs has no backward either
    row_major: tuple[int, ...] = ()  # inputs the kernels take with contiguous rows only (others go to torch)
    # Tangents compared with torch's computed in double precision: torch's float32 ones through a chain of
    # factorizations round differently with the CPU's vector width (householder_product's by 2x float32's
    # tolerance on an AVX-512 CPU, where ours stay within it of the exact ones).
    double_jvp: bool = False

    def __repr__(self) -> str:
        return self.name

    def check(self, got, want):
        """``got`` equals torch's ``want`` output by output (integer outputs exactly)."""
        got = got if isinstance(got, tuple) else (got,)
        want = want if isinstance(want, tuple) else (want,)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.shape == w.shape, (g.shape, w.shape)
            if g.is_floating_point() or g.is_complex():
                assert_close(g.detach(), w.detach(), scale=self.scale)
            else:
                assert torch.equal(g.cpu(), w.cpu())


def _scaled_mm(a, b, scale_a, scale_b, bias):
    return torch._scaled_mm(a, b, scale_a, scale_b, bias=bias, out_dtype=torch.float32)


def _our_scaled_mm(a, b, scale_a, scale_b, bias):
    return mps_ext.scaled_mm(a, b, scale_a, scale_b, bias=bias, out_dtype=torch.float32)


def _scaled_mm_reference(a, b, scale_a, scale_b, bias):
    return (a.float() * scale_a) @ (b.float() * scale_b) + bias


def _scaled_mm_inputs(seed):
    a, sa = fp8.quantize(randn(3, 32, seed=seed), dim=1)
    w, sb = fp8.quantize(randn(16, 32, seed=seed + 1), dim=1)
    return a, w.t(), sa, sb.t(), randn(16, seed=seed + 2)


def _lu_solve_inputs(dtype):
    def make(seed):
        LU, pivots = torch.linalg.lu_factor(well_conditioned(3, 6, dtype, seed))
        return LU, pivots, randn(3, 6, 2, dtype=dtype, seed=seed + 5)
    return make


def _grouped_rows(a, b, offs):
    """torch._grouped_mm with offs splitting a's rows, as a loop of products (torch's has no forward derivative)."""
    ends = [0] + offs.tolist()
    return torch.cat([a[s:e] @ b[g] for g, (s, e) in enumerate(zip(ends, ends[1:]))])


def _fp8_linear_inputs(seed):
    w, scale = fp8_weight(16, 32, seed + 1)
    return randn(2, 32, seed=seed), w, scale, randn(16, seed=seed + 2)


def _fp8_linear_reference(x, w, scale, bias):
    return F.linear(x, w.float() * scale, bias)


def _fp8_grouped_mm_inputs(seed):
    w, scale = fp8.quantize(randn(3, 16, 32, seed=seed + 1), dim=2)
    return randn(6, 32, seed=seed), w, scale, torch.tensor([2, 3, 6], dtype=torch.int32)


def _fp8_grouped_mm_reference(x, w, scale, offs):
    return _grouped_rows(x, (w.float() * scale).transpose(-2, -1), offs)


CASES = [
    Case("softmax", lambda s: (randn(3, 33, seed=s),), lambda x: mps_ext.softmax(x, -1),
         lambda x: torch.softmax(x, -1), (0,)),
    Case("log_softmax", lambda s: (randn(3, 33, seed=s),), lambda x: mps_ext.log_softmax(x, -1),
         lambda x: torch.log_softmax(x, -1), (0,)),
    Case("linear", lambda s: (randn(2, 32, seed=s), randn(16, 32, seed=s + 1), randn(16, seed=s + 2)),
         mps_ext.linear, F.linear, (0, 1, 2), scale=4, row_major=(1,)),
    Case("fp8_linear", _fp8_linear_inputs, mps_ext.fp8_linear, _fp8_linear_reference, (0, 2, 3), scale=4,
         overridden=False),
    Case("scaled_mm", _scaled_mm_inputs, _our_scaled_mm, _scaled_mm, (2, 3, 4), scale=4,
         reference_jvp=_scaled_mm_reference, reference_backward=_scaled_mm_reference),
    Case("grouped_mm", lambda s: (randn(6, 16, seed=s), randn(3, 8, 16, seed=s + 1).transpose(-2, -1),
                                  torch.tensor([2, 3, 6], dtype=torch.int32)),
         mps_ext.grouped_mm, lambda a, b, offs: torch._grouped_mm(a, b, offs=offs), (0, 1), scale=4,
         reference_jvp=_grouped_rows),
    Case("fp8_grouped_mm", _fp8_grouped_mm_inputs, mps_ext.fp8_grouped_mm, _fp8_grouped_mm_reference, (0, 2),
         scale=4, overridden=False),
]
# Order 6 at condition <= 10 (both makers above): every output, gradient and tangent of these cases is within
# float32's own tolerance of torch's (measured); twice that leaves headroom and still rejects a result 1.01x off.
LINALG_SCALE = 2.0
for _dtype, _suffix in ((torch.float32, ""), (torch.complex64, "_complex")):
    CASES += [
        Case("lu_factor_ex" + _suffix, lambda s, d=_dtype: (well_conditioned(3, 6, d, s),), mps_ext.lu_factor_ex,
             torch.linalg.lu_factor_ex, (0,), scale=LINALG_SCALE, double_jvp=True),
        Case("lu_solve" + _suffix, _lu_solve_inputs(_dtype), mps_ext.lu_solve, torch.linalg.lu_solve, (0, 2),
             scale=LINALG_SCALE, double_jvp=True),
        Case("solve_ex" + _suffix, lambda s, d=_dtype: (well_conditioned(3, 6, d, s), randn(3, 6, 2, dtype=d, seed=s)),
             mps_ext.solve_ex, torch.linalg.solve_ex, (0, 1), scale=LINALG_SCALE, double_jvp=True),
        Case("inv_ex" + _suffix, lambda s, d=_dtype: (well_conditioned(3, 6, d, s),), mps_ext.inv_ex,
             torch.linalg.inv_ex, (0,), scale=LINALG_SCALE, double_jvp=True),
        Case("qr" + _suffix, lambda s, d=_dtype: (randn(3, 7, 5, dtype=d, seed=s),), mps_ext.qr, torch.linalg.qr,
             (0,), scale=LINALG_SCALE, double_jvp=True),
        Case("householder_product" + _suffix,
             lambda s, d=_dtype: (randn(3, 7, 5, dtype=d, seed=s), randn(3, 4, dtype=d, seed=s + 1)),
             mps_ext.householder_product, torch.linalg.householder_product, (0, 1), scale=LINALG_SCALE, double_jvp=True),
        Case("solve_triangular" + _suffix,
             lambda s, d=_dtype: (triangular(3, 6, d, s), randn(3, 6, 2, dtype=d, seed=s + 3)),
             lambda A, B: mps_ext.solve_triangular(A, B, upper=True),
             lambda A, B: torch.linalg.solve_triangular(A, B, upper=True), (0, 1), scale=LINALG_SCALE, double_jvp=True),
    ]


# --- FP8: every operator with every form of its scales ----------------------------------------------------------

FP8_BLOCK = (8, 16)  # partial blocks at both ends of the weights below


def _per_code(scale, shape, block):
    """A grid of block-wise scales repeated to every code of a (..., N, K) weight."""
    n, k = shape[-2:]
    return scale.repeat_interleave(block[0], -2)[..., :n, :].repeat_interleave(block[1], -1)[..., :k]


def dequantized(w, scale, block):
    """``w * scale`` by torch, in scale's dtype: one scale per matrix (tensor or expert), per output channel, or
    with ``block`` per block."""
    w = w.to(scale.dtype)
    if block is not None:
        return w * _per_code(scale, w.shape, block)
    return w * scale.reshape(*w.shape[:-2], -1, 1)


def _fp8_linear_form(granularity):
    block = FP8_BLOCK if granularity == "block" else None

    def make(seed):
        w = randn(20, 40, seed=seed + 1)
        q, scale = fp8.quantize(w, block=block) if block else fp8.quantize(w, dim=None if granularity == "tensor"
                                                                            else 1)
        scale = scale.reshape(-1) if granularity == "channel_1d" else scale
        return randn(3, 40, seed=seed), q, scale, randn(20, seed=seed + 2)

    return Case(f"fp8_linear-{granularity}", make, lambda x, w, s, b: mps_ext.fp8_linear(x, w, s, b, block),
                lambda x, w, s, b: F.linear(x, dequantized(w, s, block), b), (0, 2, 3), scale=4, overridden=False)


def _fp8_grouped_mm_form(granularity):
    block = FP8_BLOCK if granularity == "block" else None

    def make(seed):
        w = randn(3, 12, 40, seed=seed + 1)
        if granularity.startswith("channel"):
            q, scale = fp8.quantize(w, dim=2)
        else:
            q, scale = (torch.stack(t) for t in zip(*(fp8.quantize(m, block=block) if block else fp8.quantize(m)
                                                        for m in w)))
        shapes = {"expert": (3,), "expert_3d": (3, 1, 1), "channel": (3, 12, 1), "channel_2d": (3, 12)}
        scale = scale.reshape(shapes.get(granularity, scale.shape))
        offs = torch.tensor([[2, 2, 6], [1, 4, 6], [0, 3, 6]][seed % 3], dtype=torch.int32)  # empty groups too
        return randn(6, 40, seed=seed), q, scale, offs

    return Case(f"fp8_grouped_mm-{granularity}", make,
                lambda x, w, s, offs: mps_ext.fp8_grouped_mm(x, w, s, offs, block),
                lambda x, w, s, offs: _grouped_rows(x, dequantized(w, s, block).transpose(-2, -1), offs), (0, 2),
                scale=4, overridden=False)


def _scaled_mm_form(granularity):
    dim = 1 if granularity == "row" else None

    def make(seed):
        a, scale_a = fp8.quantize(randn(3, 32, seed=seed), dim=dim)
        w, scale_b = fp8.quantize(randn(16, 32, seed=seed + 1), dim=dim)
        return a, w.t(), scale_a, scale_b.t(), randn(16, seed=seed + 2)

    return Case(f"scaled_mm-{granularity}", make, _our_scaled_mm,
                lambda a, b, sa, sb, bias: (a.to(sa.dtype) * sa) @ (b.to(sb.dtype) * sb) + bias, (2, 3, 4), scale=4)


def _dequantize_form(granularity):
    block = FP8_BLOCK if granularity == "block" else None
    dim = {"dim0": 0, "dim1": 1}.get(granularity)

    def make(seed):
        return fp8.quantize(randn(20, 40, seed=seed), dim=dim, block=block)

    return Case(f"dequantize-{granularity}", make, lambda q, s: fp8.dequantize(q, s, block=block),
                lambda q, s: _per_code(s, q.shape, block) * q.to(s.dtype) if block else q.to(s.dtype) * s, (1,))


# Their references compute in the scales' dtype: float64 ones give exact derivatives.
FP8_FORMS = ([_fp8_linear_form(g) for g in ("tensor", "channel", "channel_1d", "block")]
             + [_fp8_grouped_mm_form(g) for g in ("expert", "expert_3d", "channel", "channel_2d", "block")]
             + [_scaled_mm_form(g) for g in ("tensor", "row")]
             + [_dequantize_form(g) for g in ("tensor", "dim0", "dim1", "block")])
