"""The shared tolerance helpers reject the errors they exist to catch (a dropped term, a 1 % scale, a NaN
turned into a number) and accept what honest kernels produce (float32 sums in another order, one unit
of a half or bfloat16 output)."""

import pytest
import torch
import torch.nn.functional as F

from op_cases import well_conditioned
from tolerances import (TOLERANCES, assert_close, assert_close_conditioned, assert_close_dot, assert_close_normwise,
                        assert_lu_backward_stable, assert_solve_backward_stable, assert_solves)

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def operands(dtype, n, k, nan=False):
    g = torch.Generator().manual_seed(k)
    x, w = torch.randn(3, k, generator=g).to(dtype), torch.randn(n, k, generator=g).to(dtype)
    if nan:
        x[1, k // 2] = float("nan")
    return x, w


def exact(x, w):
    return x.double() @ w.double().t()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,k", [(127, 96), (127, 4099), (9, 4099)])
def test_dot_tolerance(dtype, n, k):
    x, w = operands(dtype, n, k, nan=True)
    want = exact(x, w).to(dtype)
    magnitude = x.double().abs() @ w.double().abs().t()
    # A float32 GEMV (another summation order) passes.
    assert_close_dot(F.linear(x.float(), w.float()).to(dtype), want, magnitude, k)
    planted = {
        "the last K element dropped": exact(x[:, :-1], w[:, :-1]).to(dtype),
        "every output x 1.01": (exact(x, w) * 1.01).to(dtype),
        "a NaN turned into 0": want.nan_to_num(0.0),
    }
    for what, got in planted.items():
        with pytest.raises(AssertionError, match="differ"):
            assert_close_dot(got, want, magnitude, k)
            pytest.fail(f"{what} passed")


@pytest.mark.parametrize("dtype", DTYPES)
def test_elementwise_tolerance(dtype):
    want = (torch.randn(4096, generator=torch.Generator().manual_seed(0)) * 3).softmax(0).to(dtype)
    want[7] = float("nan")
    bits = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}[dtype]
    assert_close((want.view(bits) + 1).view(dtype), want)  # one unit above: two roundings may differ by that
    for what, got in {"every output x 1.01": (want.double() * 1.01).to(dtype),
                      "a NaN turned into 0": want.nan_to_num(0.0),
                      "the largest output doubled": want.index_fill(0, want.nan_to_num(0).argmax(0, keepdim=True),
                                                                   2 * want.nan_to_num(0).max().item())}.items():
        with pytest.raises(AssertionError, match="not close"):
            assert_close(got, want)
            pytest.fail(f"{what} passed")


@pytest.mark.parametrize("dtype", DTYPES)
def test_normwise_tolerance(dtype):
    g = torch.Generator().manual_seed(0)
    want = (torch.randn(64, 48, generator=g) @ torch.randn(48, 32, generator=g)).to(dtype)
    want[3, 4] = float("nan")
    # Cancellation: an entry far below the largest may be off by up to one unit at the largest magnitude.
    cancelled = want.clone()
    cancelled[0, 0] = 0
    want[0, 0] = TOLERANCES[dtype][0] / 2 * float(want.nan_to_num(0).abs().max())
    assert_close_normwise(cancelled, want)
    for what, got in {"every output x 1.03": (want.double() * 1.03).to(dtype),
                      "a NaN turned into 0": want.nan_to_num(0.0)}.items():
        with pytest.raises(AssertionError, match="not close"):
            assert_close_normwise(got, want)
            pytest.fail(f"{what} passed")


@pytest.mark.parametrize("dtype", [torch.float32, torch.complex64])
@pytest.mark.parametrize("n", [3, 64])
def test_backward_error_bounds(dtype, n):
    A = torch.randn(4, n, n, dtype=dtype, generator=torch.Generator().manual_seed(n))
    B = torch.randn(4, n, 2, dtype=dtype, generator=torch.Generator().manual_seed(n + 1))
    LU, pivots = torch.linalg.lu_factor(A)  # LAPACK in float32: rounding errors, no mistakes
    X = torch.linalg.lu_solve(LU, pivots, B)
    assert_lu_backward_stable(LU, pivots, A)
    assert_solve_backward_stable(A, X, B, LU, pivots)
    Y = torch.linalg.lu_solve(LU, pivots, B.mT, left=False, adjoint=True)
    assert_solve_backward_stable(A, Y, B.mT, LU, pivots, left=False, adjoint=True)
    skipped = LU.clone()
    skipped[:, -1, -1] += LU[:, -1, -2] * LU[:, -2, -1]  # U's last entry without the last update
    for what, factors in {"factors x 1.01": LU * 1.01, "the last update skipped": skipped}.items():
        with pytest.raises(AssertionError, match="P L U - A"):
            assert_lu_backward_stable(factors, pivots, A)
            pytest.fail(f"{what} passed")
    for what, solution in {"solution x 1.01": X * 1.01, "the first row 10% off": X.index_fill(-2, torch.tensor([0]), 0) + X[..., :1, :] * 1.1}.items():
        with pytest.raises(AssertionError, match="residual"):
            assert_solve_backward_stable(A, solution, B, LU, pivots)
            pytest.fail(f"{what} passed")


# Every order a linear-algebra test of the suite solves or factors at.
LINALG_ORDERS = [1, 2, 3, 4, 5, 6, 8, 9, 12, 16, 17, 20, 32, 33, 37, 40, 64]


@pytest.mark.parametrize("dtype", [torch.float32, torch.complex64])
def test_linalg_bounds_reject_a_one_percent_scale_at_every_order(dtype):
    wide = torch.complex128 if dtype.is_complex else torch.float64
    for n in LINALG_ORDERS:
        A = well_conditioned(2, n, dtype, seed=n)
        B = torch.randn(2, n, 3, dtype=dtype, generator=torch.Generator().manual_seed(n))
        X, LU = torch.linalg.solve(A, B), torch.linalg.lu_factor(A)[0]  # LAPACK in float32: honest results
        exact_X, exact_LU = torch.linalg.solve(A.to(wide), B.to(wide)), torch.linalg.lu_factor(A.to(wide))[0]
        assert_solves(A, X, B)
        assert_solves(A, torch.linalg.solve(A, B.mT, left=False), B.mT, left=False)
        assert_solves(A, torch.linalg.solve(A.mH, B), B, adjoint=True)
        assert_close_conditioned(X, exact_X, A)
        assert_close_conditioned(LU, exact_LU, A)
        with pytest.raises(AssertionError, match="backward errors"):
            assert_solves(A, X * 1.01, B)
            pytest.fail(f"a solution 1.01x off passed the backward-error bound at order {n}")
        for got, exact in ((X, exact_X), (LU, exact_LU)):
            with pytest.raises(AssertionError, match="forward errors"):
                assert_close_conditioned(got * 1.01, exact, A)
                pytest.fail(f"a result 1.01x off passed the forward-error bound at order {n}")
