"""Per-dtype tolerances for comparing kernel results with torch on the CPU, stated once."""

import torch

# (rtol, atol): float32 allows reduction-order differences over long rows;
# half and bfloat16 allow a few units in the last place of their results.
TOLERANCES = {
    torch.float32: (1e-5, 1e-6),
    torch.float16: (2e-3, 1e-4),
    torch.bfloat16: (1.6e-2, 1e-3),
}


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype | None = None, scale: float = 1.0):
    """torch.testing.assert_close with this project's tolerance for ``dtype``
    (default: actual's), NaNs compared equal. ``scale`` widens it for
    long reductions."""
    rtol, atol = TOLERANCES[dtype or actual.dtype]
    torch.testing.assert_close(actual, expected.to(actual.dtype), rtol=rtol * scale, atol=atol * scale,
                               equal_nan=True)


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
