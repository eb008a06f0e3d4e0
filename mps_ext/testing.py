"""Comparing kernel results with torch on the CPU: the per-dtype tolerances
used by the self-test and the test suite, stated once."""

from __future__ import annotations

import torch

# (rtol, atol). float32 allows reduction-order differences. A half or bfloat16
# result and its reference are each one rounding of nearly the same float
# value, so they differ by at most one unit in the last place: rtol is one
# ulp (2^-10, 2^-7), and atol only covers half's subnormal spacing (2^-24) —
# a looser atol would hide errors in the many tiny outputs of a softmax.
TOLERANCES = {
    torch.float32: (1e-5, 1e-6),
    torch.float16: (9.8e-4, 6e-8),
    torch.bfloat16: (7.9e-3, 1e-30),
    torch.complex64: (1e-5, 1e-6),  # each part a float32
}


def reduction_scale(dtype: torch.dtype, n: int, signed_terms: bool = True) -> float:
    """How much to widen the tolerance for results that sum ``n`` terms.

    In float32 the rounding error of a sum grows like n * eps when terms
    cancel (dot products) and like sqrt(n) * eps relative to the sum when
    they are all positive (softmax's denominator); the fixed float32
    tolerance assumes short sums. Half and bfloat16 results, accumulated in
    float32, are dominated by their final rounding.
    """
    if dtype != torch.float32:
        return 1.0
    return max(1.0, n / 32 if signed_terms else n ** 0.5 / 64)


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype | None = None, scale: float = 1.0,
                 atol: float = 0.0):
    """``torch.testing.assert_close`` with the tolerance of ``dtype`` (default:
    actual's), widened by ``scale``, plus ``atol``; NaNs compare equal."""
    rtol, dtype_atol = TOLERANCES[dtype or actual.dtype]
    torch.testing.assert_close(actual.cpu(), expected.cpu().to(actual.dtype), rtol=rtol * scale,
                               atol=dtype_atol * scale + atol, equal_nan=True)


# How far above the typical rounding error of a float32 dot product
# assert_close_dot allows (see dot_bound). Over every case of the GEMV, FP8
# and grouped-matmul tests the largest error beyond the output's own
# tolerance was 0.085 of sqrt(k) * 2^-24 * magnitude: 2 leaves 23x headroom.
DOT_HEADROOM = 2.0


def assert_close_normwise(actual: torch.Tensor, expected: torch.Tensor):
    """Results of a chain of products and sums (a model layer's output, its
    gradients), where cancellation leaves some entries far below the tensor's
    scale: each entry within the dtype's tolerance of itself plus one unit at
    the tensor's largest magnitude. NaNs compare equal.

    Measured on transformers' Qwen3-MoE block: float32 entries differ from
    torch's by at most 2.6e-7 of the largest entry (one unit is 1e-5),
    bfloat16 ones by 4.7e-5 (one unit is 7.9e-3).
    """
    rtol, atol = TOLERANCES[actual.dtype]
    scale = float(expected.detach().abs().nan_to_num(0, 0, 0).max()) if expected.numel() else 0.0
    torch.testing.assert_close(actual.cpu(), expected.cpu().to(actual.dtype), rtol=rtol, atol=atol + rtol * scale,
                               equal_nan=True)


def dot_bound(magnitude: torch.Tensor, k: int) -> torch.Tensor:
    """The float32 rounding error two length-``k`` dot products (ours and the
    reference) may differ by, for terms of total magnitude ``magnitude``
    (e.g. ``|a| @ |b|``).

    The worst case grows like ``k * 2^-24 * magnitude``, but rounding errors
    of independent terms add like a random walk: the error of a sum stays near
    ``sqrt(k) * 2^-24 * magnitude`` (and tree or blocked orders, as GPU
    reductions use, are smaller still). The worst-case bound let a GEMV that
    drops one of 4099 K elements pass; this one does not.
    """
    return DOT_HEADROOM * max(k, 1) ** 0.5 * 2.0**-24 * magnitude.detach().cpu().double()


def assert_close_dot(actual: torch.Tensor, expected: torch.Tensor, magnitude: torch.Tensor, k: int):
    """Results of length-``k`` dot products accumulated in float32 in any order,
    against a reference computed the same way but in another order (or in
    float64).

    The two sums differ by at most :func:`dot_bound`, and that difference can
    move the rounding to a half or bfloat16 output by one unit: the bound is
    that plus the output dtype's tolerance. NaNs compare equal.
    """
    rtol, atol = TOLERANCES[actual.dtype]
    got, want = actual.detach().cpu().double(), expected.detach().cpu().double()
    assert got.shape == want.shape, (got.shape, want.shape)
    bound = rtol * want.abs() + atol + dot_bound(magnitude, k)
    same = (got == want) | (got.isnan() & want.isnan())
    bad = ~same & ~((got - want).abs() <= bound)
    assert not bad.any(), (f"{int(bad.sum())} of {got.numel()} differ; first at {bad.nonzero()[0].tolist()}: "
                           f"{got[bad][0].item()} vs {want[bad][0].item()}")


def _gamma(n: int, dtype: torch.dtype) -> float:
    """Higham's gamma_n = n u / (1 - n u), the bound on the relative rounding
    error of n floating-point operations in a row; complex arithmetic costs a
    small constant factor more (Higham, Accuracy and Stability of Numerical
    Algorithms, 3.6), taken here as 4."""
    u = 2.0**-53 if dtype in (torch.float64, torch.complex128) else 2.0**-24
    n *= 4 if dtype.is_complex else 1
    return n * u / (1 - n * u)


def _assert_residual_within(residual: torch.Tensor, magnitude: torch.Tensor, gamma: float, what: str):
    bound = gamma * magnitude
    bad = residual.abs() > bound  # NaN residuals (from NaN or inf inputs) are not bounded here
    assert not bad.any(), (f"{what}: {int(bad.sum())} of {bad.numel()} residual entries exceed the backward-error "
                           f"bound; the worst is {float((residual.abs() / bound)[bad].max()):.3g}x it")


def _unpacked(LU: torch.Tensor, pivots: torch.Tensor):
    wide = torch.complex128 if LU.dtype.is_complex else torch.float64
    return torch.lu_unpack(LU.detach().cpu().to(wide), pivots.detach().cpu())


def assert_lu_backward_stable(LU: torch.Tensor, pivots: torch.Tensor, A: torch.Tensor):
    """The packed LU factors with partial pivoting of square ``A`` (as
    ``torch.linalg.lu_factor`` returns them) are those of ``A`` up to rounding:
    ``|P L U - A| <= gamma_n P |L| |U|`` entry by entry (Higham, Theorem 9.3).

    The bound is rigorous, so it needs no measured headroom, and it holds
    whatever order the kernel sums in; factors scaled by 1.01, or one update
    skipped, are far outside it."""
    P, L, U = _unpacked(LU, pivots)
    wide = P.dtype
    residual = P @ L @ U - A.detach().cpu().to(wide)
    magnitude = P.real @ (L.abs() @ U.abs())
    _assert_residual_within(residual, magnitude, _gamma(A.shape[-1], LU.dtype), "P L U - A")


def assert_solve_backward_stable(A: torch.Tensor, X: torch.Tensor, B: torch.Tensor, LU: torch.Tensor,
                                 pivots: torch.Tensor, left: bool = True, adjoint: bool = False):
    """``X`` solves ``op(A) X = B`` (``X op(A) = B`` when not ``left``; ``op``
    the conjugate transpose when ``adjoint``) through the LU factors
    ``LU``/``pivots`` of ``A`` up to rounding: the residual is within
    ``gamma_3n`` of ``op(P |L| |U|) |X|`` (``|X| op(P |L| |U|)``) entry by
    entry, the backward error of a factorization and two triangular solves
    (Higham, Theorem 9.4), rigorous like :func:`assert_lu_backward_stable`."""
    P, L, U = _unpacked(LU, pivots)
    wide = P.dtype
    A, X, B = (t.detach().cpu().to(wide) for t in (A, X, B))
    # A batch of vectors, by torch.linalg.solve's rule
    vector = B.dim() == 1 or (B.dim() == A.dim() - 1 and B.shape == A.shape[:-1])
    if vector:
        X, B = X.unsqueeze(-1), B.unsqueeze(-1)
    factors = P.real @ (L.abs() @ U.abs())
    if adjoint:
        A, factors = A.mH, factors.mT
    residual, magnitude = (A @ X - B, factors @ X.abs()) if left else (X @ A - B, X.abs() @ factors)
    _assert_residual_within(residual, magnitude, _gamma(3 * A.shape[-1], LU.dtype), "the solution's residual")


# How far past gamma_n a backward error, and past cond * gamma_n a forward error, may go. LAPACK's own tests
# call a solver wrong past 30 n eps (xGET02, xGET04). Over every linear-algebra case of the suite the largest
# is 2.0 (order 1: the two divisions compared are rounded once each), 1.3 from order 2 on, backward errors
# 0.81. At condition <= 10 every right-hand side and matrix of a result 1.01x off is past the bound at every
# order up to 64 (measured, tests/test_tolerances.py; the closest: complex order-64 forward errors, at 4.4).
LINALG_HEADROOM = 4.0


def condition(A: torch.Tensor) -> torch.Tensor:
    """The 1-norm condition number of each matrix of ``A`` (float64; inf where it is singular), which bounds
    how far rounding errors in a solution or a factorization can move it; for rectangular ``A`` (QR) the
    2-norm one, the ratio of the extreme singular values, which torch defines for any shape."""
    wide = torch.complex128 if A.dtype.is_complex else torch.float64
    square = A.shape[-1] == A.shape[-2]
    return torch.linalg.cond(A.detach().cpu().to(wide), p=1 if square else None).real


def _check_ratio(ratio: torch.Tensor, what: str):
    bad = ratio > LINALG_HEADROOM  # NaN ratios (NaN or inf inputs) are not judged
    assert not bad.any(), (f"{what}: {int(bad.sum())} of {bad.numel()} exceed the bound; the worst is "
                           f"{float(ratio[bad].max()):.3g}x gamma_n (times cond for forward errors)")


def assert_solves(A: torch.Tensor, X: torch.Tensor, B: torch.Tensor, left: bool = True, adjoint: bool = False):
    """``X`` solves ``op(A) X = B`` (``X op(A) = B`` when not ``left``; ``op`` the conjugate transpose when
    ``adjoint``) as well as float arithmetic can: the normwise backward error of every right-hand side x,
    ``|op(A) x - b| / (|op(A)| |x| + |b|)`` in the 1-norm, is within ``LINALG_HEADROOM * gamma_n``.

    Whatever algorithm ran (an LU solve, a triangular solve, a product with an inverse), a stable one stays
    there; the bound does not depend on A's condition, so it judges solutions of any system."""
    if X.numel() == 0:
        return
    gamma = _gamma(A.shape[-1], X.dtype)
    wide = torch.complex128 if A.dtype.is_complex else torch.float64
    A, X, B = (t.detach().cpu().to(wide) for t in (A, X, B))
    vector = B.dim() == 1 or (B.dim() == A.dim() - 1 and B.shape == A.shape[:-1])  # torch.linalg.solve's rule
    if vector:
        X, B = X.unsqueeze(-1), B.unsqueeze(-1)
    if adjoint:
        A = A.mH
    if not left:  # X A = B is A^T X^T = B^T: right-hand sides as columns
        A, X, B = A.mT, X.mT, B.mT
    residual = (A @ X - B).abs().sum(-2)
    scale = A.abs().sum(-2).amax(-1, keepdim=True) * X.abs().sum(-2) + B.abs().sum(-2)
    _check_ratio(residual / scale / gamma, "backward errors of the solution")


def assert_close_conditioned(actual: torch.Tensor, expected: torch.Tensor, A: torch.Tensor):
    """``actual`` and ``expected``, two computations of a result of the order-n matrices ``A`` (solutions,
    LU and QR factors, gradients; n the larger side of a rectangular A), agree as far as A's condition lets rounding errors move them: per matrix,
    ``max |actual - expected| <= LINALG_HEADROOM * cond(A) * gamma_n * max |expected|``. NaNs must sit at the
    same places."""
    wide = torch.complex128 if actual.dtype.is_complex else torch.float64
    got, want = actual.detach().cpu().to(wide), expected.detach().cpu().to(wide)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert torch.equal(got.isnan(), want.isnan()), "NaNs at other places"
    if got.numel() == 0:
        return
    if got.dim() < 2:
        got, want = got.unsqueeze(-1), want.unsqueeze(-1)
    same = (got == want) | got.isnan()
    error = (got - want).abs().masked_fill(same, 0).flatten(-2).amax(-1)
    size = want.abs().nan_to_num(0, 0, 0).flatten(-2).amax(-1)
    bound = condition(A) * _gamma(max(A.shape[-2:]), actual.dtype) * size
    assert bound.shape == error.shape, f"results of {tuple(error.shape)} matrices for {tuple(bound.shape)} matrices A"
    _check_ratio(error / bound.clamp_min(torch.finfo(torch.float64).tiny), "forward errors")


def assert_qr(A: torch.Tensor, Q: torch.Tensor, R: torch.Tensor):
    """``Q R`` is ``A`` and ``Q`` has orthonormal columns as well as Householder QR in float arithmetic can
    (Higham, Theorem 19.4): normwise per matrix, ``|A - Q R| <= LINALG_HEADROOM * gamma_m |A|`` and
    ``|Q^H Q - I| <= LINALG_HEADROOM * gamma_m``, in the 1-norm; the bounds do not depend on A's condition."""
    if A.numel() == 0:
        return
    gamma = _gamma(max(A.shape[-2:]), Q.dtype)
    wide = torch.complex128 if A.dtype.is_complex else torch.float64
    A, Q, R = (t.detach().cpu().to(wide) for t in (A, Q, R))
    if Q.numel():
        A_norm = A.abs().sum(-2).amax(-1)
        _check_ratio((A - Q @ R).abs().sum(-2).amax(-1) / A_norm.clamp_min(1e-300) / gamma, "backward errors of Q R")
        eye = torch.eye(Q.shape[-1], dtype=wide)
        _check_ratio((Q.mH @ Q - eye).abs().sum(-2).amax(-1) / gamma, "orthogonality of Q")


def conditioned_scale(A: torch.Tensor) -> float:
    """How much to widen the float32/complex64 tolerance to compare, entry by entry, two computations of a
    result of the matrices ``A`` (the self-test's comparison): :func:`assert_close_conditioned`'s bound,
    ``LINALG_HEADROOM * cond(A) * gamma_n``, in units of float32's relative tolerance (at least one)."""
    gamma = _gamma(max(A.shape[-2:]), A.dtype)
    return max(1.0, LINALG_HEADROOM * float(condition(A).max()) * gamma / TOLERANCES[torch.float32][0])


def max_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """Largest absolute difference, NaNs at the same places ignored (inf where only one side is NaN)."""
    a, e = actual.detach().cpu().double(), expected.detach().cpu().double()
    if not torch.equal(a.isnan(), e.isnan()):
        return float("inf")
    same = (a == e) | a.isnan()
    return float((a - e).abs().masked_fill(same, 0).max()) if a.numel() else 0.0


def assert_raises_like(ours, theirs):
    """``ours()`` raises what ``theirs()`` (torch's) raises: the same exception type and message."""
    try:
        theirs()
    except Exception as e:  # noqa: BLE001 (whatever torch raises is the reference)
        expected = e
    else:
        raise AssertionError("the reference call raised nothing")
    try:
        ours()
    except Exception as e:  # noqa: BLE001
        assert type(e) is type(expected) and str(e) == str(expected), f"{e!r} where torch raises {expected!r}"
    else:
        raise AssertionError(f"nothing raised where torch raises {expected!r}")


def mps_usable() -> tuple[bool, str]:
    """Whether mps tensors really run here, and why not.

    ``torch.backends.mps.is_available()`` is not enough: hosted macOS CI
    runners report MPS but cannot run it (zero-byte out-of-memory, wrong
    results). This allocates, runs a small reduction and checks the answer.
    """
    from . import _C

    if not torch.backends.mps.is_available():
        return False, "MPS is not available (needs Apple silicon, macOS 14+ and a torch built with MPS)"
    if not _C._has_metal():
        return False, f"mps_ext's Metal backend is not there: {_C._metal_unavailable()}"
    try:
        x = torch.arange(4096, dtype=torch.float32, device="mps")
        got = float((x * 2).sum().cpu())
    except Exception as e:  # noqa: BLE001 - any failure means unusable
        return False, f"MPS is reported but does not run: {e}"
    if got != 4096 * 4095:
        return False, f"MPS is reported but computes wrong results ({got} != {4096 * 4095})"
    return True, "usable"


def assert_fp8_linear_decodes_every_e4m3_code(device: str, half_subnormals_flushed: bool = False):
    """Checks that ``fp8_linear`` on ``device`` decodes every e4m3fn code as torch does, subnormal codes included
    and NaN codes to NaN, through its kernel: row i of the weight holds code i in its first column, which x picks
    out, so output i is code i's value. With ``half_subnormals_flushed`` (a GPU that flushes half denormals, as
    ``mps_ext.sim.flush_half_subnormals()`` emulates), the 14 subnormal codes, which the kernel decodes through
    half subnormals, must come out as zeros instead, and every other code still exact."""
    import mps_ext
    from mps_ext import fp8

    codes = torch.zeros(256, 32, dtype=torch.uint8)
    codes[:, 0] = torch.arange(256, dtype=torch.uint8)
    want = codes[:, 0].view(torch.float8_e4m3fn).float()
    if half_subnormals_flushed:
        want = torch.where(((codes[:, 0] & 0x78) == 0), torch.zeros(()), want)
    x = torch.zeros(1, 32)
    x[0, 0] = 1.0
    weight = codes.view(fp8.storage_dtype(device)).to(device)
    with mps_ext.trace() as t:
        got = mps_ext.fp8_linear(x.to(device), weight, torch.tensor(1.0, device=device)).cpu()[0]
    backend = "metal" if torch.device(device).type == "mps" else "sim"
    assert [(k.name, k.backend) for k in t.kernels] == [("fp8_linear_gemv_stream_float", backend)]
    finite = ~want.isnan()
    assert torch.equal(got[finite], want[finite])  # -0's row too: a dot product's sum starts at +0
    assert got[~finite].isnan().all()
