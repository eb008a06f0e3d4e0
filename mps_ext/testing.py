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


def linalg_scale(n: int) -> float:
    """How much to widen the float32/complex64 tolerance for LU factors and
    solutions of well-conditioned order-``n`` systems compared with torch's
    CPU (LAPACK) results: each entry accumulates up to n rounding errors, in
    another order than LAPACK's blocked algorithm, and the solutions amplify
    them by the condition number (about n for Gaussian random matrices)."""
    return max(1.0, n * n / 8)


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


def max_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """Largest absolute difference, NaNs at the same places ignored (inf where only one side is NaN)."""
    a, e = actual.detach().cpu().double(), expected.detach().cpu().double()
    if not torch.equal(a.isnan(), e.isnan()):
        return float("inf")
    same = (a == e) | a.isnan()
    return float((a - e).abs().masked_fill(same, 0).max()) if a.numel() else 0.0


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
        return False, "mps_ext was built without its Metal backend"
    try:
        x = torch.arange(4096, dtype=torch.float32, device="mps")
        got = float((x * 2).sum().cpu())
    except Exception as e:  # noqa: BLE001 - any failure means unusable
        return False, f"MPS is reported but does not run: {e}"
    if got != 4096 * 4095:
        return False, f"MPS is reported but computes wrong results ({got} != {4096 * 4095})"
    return True, "usable"
