"""Three realistic kernels run in the simulator and compared with torch on the CPU."""

import struct

import pytest
import torch

import mps_ext.sim
from tolerances import assert_close, assert_close_conditioned, assert_lu_backward_stable, reduction_scale

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
NAMES = {torch.float32: "float", torch.float16: "half", torch.bfloat16: "bfloat"}


def run_softmax(lib, x: torch.Tensor) -> torch.Tensor:
    rows, cols = x.shape
    y = torch.empty_like(x)
    getattr(lib, f"softmax_{NAMES[x.dtype]}")(x, y, struct.pack("<II", rows, cols),
                                              threads=rows * 1024, group_size=1024)
    return y


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cols", [1, 7, 31, 33, 1000, 4097, 32000, 151936])
@pytest.mark.parametrize("rows", [1, 3])
def test_softmax_matches_torch(kernels, dtype, rows, cols):
    x = (torch.randn(rows, cols, generator=torch.Generator().manual_seed(cols)) * 4).to(dtype)
    assert_close(run_softmax(kernels("softmax"), x), torch.softmax(x.float(), -1),
                 scale=reduction_scale(dtype, cols, signed_terms=False))


def test_softmax_nan_and_inf_rows(kernels):
    x = torch.randn(5, 100)
    x[0] = float("-inf")  # no mass: NaN everywhere, like torch
    x[1, 3] = float("nan")  # NaN poisons the row
    x[2, 7] = float("inf")  # +inf: NaN at the inf, zeros elsewhere
    x[3, :50] = float("-inf")  # -inf entries get probability 0
    got, want = run_softmax(kernels("softmax"), x), torch.softmax(x, -1)
    assert_close(got, want)
    assert got[0].isnan().all() and got[1].isnan().all() and got[3, :50].eq(0).all()


def test_softmax_checked_mode(kernels):
    x = torch.randn(2, 4097)
    with mps_ext.sim.checked():
        assert_close(run_softmax(kernels("softmax"), x), torch.softmax(x, -1))


def run_gemv(lib, w, x, bias):
    n, k = w.shape
    y = torch.empty(n, dtype=w.dtype)
    rows_per_group = 4
    b = bias if bias is not None else torch.empty(0, dtype=w.dtype)
    getattr(lib, f"gemv_{NAMES[w.dtype]}")(w, x, b, y, struct.pack("<III", n, k, bias is not None),
                                           threads=-(-n // rows_per_group) * 32 * rows_per_group,
                                           group_size=32 * rows_per_group)
    return y


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,k", [(1, 1), (7, 31), (33, 4097), (256, 1024), (101, 3000)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_gemv_matches_torch(kernels, dtype, n, k, with_bias):
    g = torch.Generator().manual_seed(n * k)
    w, x = torch.randn(n, k, generator=g).to(dtype), torch.randn(k, generator=g).to(dtype)
    bias = torch.randn(n, generator=g).to(dtype) if with_bias else None
    want = torch.nn.functional.linear(x.float(), w.float(), None if bias is None else bias.float())
    assert_close(run_gemv(kernels("gemv"), w, x, bias), want, scale=reduction_scale(dtype, k))


def test_gemv_checked_mode(kernels):
    w, x = torch.randn(9, 130), torch.randn(130)
    with mps_ext.sim.checked():
        assert_close(run_gemv(kernels("gemv"), w, x, None), w @ x, scale=reduction_scale(w.dtype, 130))


def run_lu(lib, a):
    batch, n, _ = a.shape
    lu = a.clone()
    pivots = torch.zeros(batch, n, dtype=torch.int32)
    info = torch.full((batch,), -1, dtype=torch.int32)
    lib.lu_factor(lu, pivots, info, struct.pack("<II", n, batch), threads=batch * n, group_size=n)
    return lu, pivots, info


@pytest.mark.parametrize("n", [1, 2, 5, 16, 32])
def test_lu_matches_lapack(kernels, n):
    a = torch.randn(7, n, n, generator=torch.Generator().manual_seed(n))
    lu, pivots, info = run_lu(kernels("lu"), a)
    want_lu, want_pivots, want_info = torch.linalg.lu_factor_ex(a)
    assert torch.equal(pivots, want_pivots)
    assert torch.equal(info, want_info)
    assert_close_conditioned(lu, want_lu, a)
    assert_lu_backward_stable(lu, pivots, a)


def test_lu_singular_reports_info(kernels):
    a = torch.randn(3, 6, 6)
    a[1, :, 2] = 0  # column 2 is zero: U[2, 2] == 0
    a[2] = 0
    _, pivots, info = run_lu(kernels("lu"), a)
    want_lu, want_pivots, want_info = torch.linalg.lu_factor_ex(a)
    assert info.tolist() == want_info.tolist() == [0, 3, 1]
    assert torch.equal(pivots, want_pivots)


def test_lu_checked_mode(kernels):
    a = torch.randn(2, 12, 12)
    with mps_ext.sim.checked():
        lu, pivots, _ = run_lu(kernels("lu"), a)
    want_lu, want_pivots = torch.linalg.lu_factor(a)
    assert torch.equal(pivots, want_pivots)
    assert_close_conditioned(lu, want_lu, a)
    assert_lu_backward_stable(lu, pivots, a)
