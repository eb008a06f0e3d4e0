"""Householder QR: mps_ext.qr and householder_product, and torch.linalg.qr and householder_product through the
overrides, against torch.linalg on the CPU (LAPACK): the same Q and R, signs included, Q R = A and Q^H Q = I
to rounding, PyTorch's own OpInfo samples, errors, fake kernels and checked mode. Views and autograd in both
modes run from the shared table (tests/op_cases.py)."""

import pytest
import torch

import mps_ext
from mps_ext.testing import assert_raises_like
from conftest import on, ran
from op_cases import randn
from tolerances import assert_close_conditioned, assert_close_normwise, assert_qr

DTYPES = [torch.float32, torch.complex64]
MTYPE = {torch.float32: "float", torch.complex64: "float2"}
MODES = ["reduced", "complete", "r"]
# (batch, m, n): tall, wide and square, one and two rows per lane, the 64 x 64 limit.
SHAPES = [(64, 3, 3), (64, 4, 4), (16, 7, 5), (16, 5, 7), (4, 16, 16), (2, 40, 33), (2, 33, 40), (1, 64, 64),
          (3, 1, 1), (3, 6, 1), (3, 1, 6)]


def qr_kernels(dtype, mode):
    kind = MTYPE[dtype]
    return [f"qr_geqrf_simd_{kind}"] + ([] if mode == "r" else [f"qr_householder_simd_{kind}"])


def assert_same_qr(A, got, want):
    """Q and R as LAPACK's (the same signs: a flipped column is far outside the bound) and a QR of A. Both
    are as sensitive as A's first min(m, n) columns are conditioned (a wide A's Q is that block's)."""
    (Q, R), (want_Q, want_R) = got, want
    assert Q.shape == want_Q.shape and Q.stride() == want_Q.stride()
    assert R.shape == want_R.shape and R.stride() == want_R.stride()
    leading = A[..., :min(A.shape[-2:])]
    assert_close_conditioned(R, want_R, leading)
    if Q.numel():
        assert_close_conditioned(Q, want_Q, leading)
        assert_qr(A, Q, R)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_qr_matches_torch(shape, dtype, mode, device):
    A = randn(*shape, dtype=dtype, seed=shape[1] * 64 + shape[2])
    with mps_ext.trace() as t:
        got = on(device, mps_ext.qr, A, mode)
    ran(t, device, *qr_kernels(dtype, mode))
    assert_same_qr(A, got, torch.linalg.qr(A, mode))


@pytest.mark.parametrize("dtype", DTYPES)
def test_qr_rank_deficient_zero_columns_and_views(dtype, device):
    A = randn(4, 6, 4, dtype=dtype, seed=1)
    A[0] = 0  # every reflector the identity (tau 0): Q = I, R = 0
    A[1, :, 2] = 0
    A[2, 1:, 0] = 0  # nothing below the diagonal: tau 0 for a real leading entry, not for a complex one
    A[3, :, 3] = A[3, :, 1]
    Q, R = on(device, mps_ext.qr, A)
    want_Q, want_R = torch.linalg.qr(A)
    assert torch.equal(Q[0], want_Q[0]) and torch.equal(R[0], want_R[0])
    assert_qr(A, Q, R)
    # Singular, no condition number to scale by. Q's column of a dependent column of A is the direction of
    # rounding errors: any unit vector orthogonal to the others is as right.
    assert_close_normwise(Q[1:3], want_Q[1:3])
    assert_close_normwise(Q[3, :, :3], want_Q[3, :, :3])
    assert_close_normwise(R[1:], want_R[1:])
    B = randn(3, 9, 10, dtype=dtype, seed=2)
    for view in (B.mT, B[:, ::2, 1:8], B.conj(), B[:1].expand(3, 9, 10)):
        assert_same_qr(view, on(device, mps_ext.qr, view), torch.linalg.qr(view.resolve_conj()))


@pytest.mark.parametrize("scale", [1e-30, 1e30])
def test_qr_of_badly_scaled_matrices(scale, device):
    # Squares of these entries vanish or overflow in float: the norms are summed in units of the largest.
    for dtype in DTYPES:
        A = randn(4, 9, 6, dtype=dtype, seed=3) * scale
        assert_same_qr(A, on(device, mps_ext.qr, A), torch.linalg.qr(A))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,n,k", [(5, 5, 5), (7, 4, 3), (40, 33, 33), (6, 3, 0), (64, 64, 40)])
def test_householder_product_matches_torch(m, n, k, dtype, device):
    B = randn(3, m, n, dtype=dtype, seed=m)
    QR, tau = torch.geqrf(B)  # LAPACK's reflectors, the first k of them
    with mps_ext.trace() as t:
        Q = on(device, mps_ext.householder_product, QR, tau[..., :k])
    ran(t, device, f"qr_householder_simd_{MTYPE[dtype]}")
    want = torch.linalg.householder_product(QR, tau[..., :k])
    assert Q.shape == want.shape and Q.stride() == want.stride()
    assert_close_conditioned(Q, want, B)
    if k == n:
        assert_close_conditioned(Q, torch.linalg.qr(B)[0], B)


def test_empty_inputs(device):
    for shape in ((0, 3, 3), (2, 0, 4), (2, 4, 0), (0, 0)):
        A = torch.zeros(shape)
        for mode in MODES:
            got = on(device, mps_ext.qr, A, mode)
            want = torch.linalg.qr(A, mode)
            for g, w in zip(got, want):
                assert g.shape == w.shape and torch.equal(g, w), (shape, mode)


BAD_CALLS = [
    lambda m: m.qr(torch.randn(3)),
    lambda m: m.qr(torch.randn(3, 3), "economic"),
    lambda m: m.qr(torch.ones(3, 3, dtype=torch.int32)),
    lambda m: m.householder_product(torch.randn(3, 4), torch.randn(2)),
    lambda m: m.householder_product(torch.randn(5, 3), torch.randn(4)),
    lambda m: m.householder_product(torch.randn(2, 5, 3), torch.randn(3, 2)),
    lambda m: m.householder_product(torch.randn(5, 3), torch.randn(2, dtype=torch.complex64)),
]


@pytest.mark.fallback("not a matrix|mode|dtype Int|shapes|dtypes differ")  # torch raises
@pytest.mark.parametrize("i", range(len(BAD_CALLS)))
def test_bad_input_raises_like_torch(i):
    assert_raises_like(lambda: BAD_CALLS[i](mps_ext), lambda: BAD_CALLS[i](torch.linalg))


class TestOverrides:
    def test_torch_linalg_runs_the_kernels(self):
        A = randn(8, 6, 4, seed=1)
        QR, tau = torch.geqrf(A)
        mps_ext.overrides.reset_stats()
        with mps_ext.overrides.enabled("cpu"), mps_ext.trace() as t:
            got = torch.linalg.qr(A, mode="complete")
            Q = torch.linalg.householder_product(QR, tau)
        ran(t, "cpu", "qr_geqrf_simd_float", "qr_householder_simd_float", "qr_householder_simd_float")
        assert_same_qr(A, got, torch.linalg.qr(A, mode="complete"))
        assert_close_conditioned(Q, torch.linalg.householder_product(QR, tau), A)
        stats = mps_ext.overrides.stats()
        for op in ("aten::linalg_qr", "aten::linalg_householder_product"):
            assert stats[op] == {"hits": 1, "fallbacks": 0, "reasons": {}}, op

    @pytest.mark.fallback("size above 64|dtype Double")
    def test_fallbacks_are_counted_with_the_reason(self):
        mps_ext.overrides.reset_stats()
        with mps_ext.overrides.enabled("cpu"), mps_ext.trace() as t:
            Q, R = torch.linalg.qr(randn(2, 65, 3))
            torch.linalg.qr(randn(3, 3).double())
        assert t.kernels == [] and Q.shape == (2, 65, 3)
        assert mps_ext.overrides.stats()["aten::linalg_qr"]["reasons"] == {"size above 64": 1, "dtype Double": 1}

    @pytest.mark.parametrize("dtype", DTYPES)
    def test_gradients_through_torch_linalg_qr(self, dtype):
        A0, W = randn(3, 7, 5, dtype=dtype, seed=1), randn(3, 7, 5, dtype=dtype, seed=2)

        def grad():
            A = A0.clone().requires_grad_()
            Q, R = torch.linalg.qr(A)
            ((Q * W).sum() + (R * W[..., :5, :]).sum()).abs().backward()
            return A.grad

        want = grad()
        with mps_ext.overrides.enabled("cpu"), mps_ext.trace() as t:
            got = grad()
        assert t.names[:2] == qr_kernels(dtype, "reduced")
        assert_close_conditioned(got, want, A0)


@pytest.fixture(scope="module")
def op_db():
    from torch.testing._internal.common_methods_invocations import op_db
    return {op.name: op for op in op_db}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", MODES)
def test_pytorch_opinfo_samples(mode, dtype, op_db):
    samples = list(op_db["linalg.qr"].sample_inputs("cpu", dtype))
    assert len(samples) == 36
    for sample in samples:
        A = sample.input
        want = torch.linalg.qr(A, mode)
        with mps_ext.overrides.enabled("cpu"), mps_ext.trace() as t:
            got = torch.linalg.qr(A, mode)
        if A.numel():
            assert t.names == qr_kernels(dtype, mode), sample
            assert_same_qr(A, got, want)
        else:
            assert all(g.shape == w.shape for g, w in zip(got, want)), sample


@pytest.mark.parametrize("dtype", DTYPES)
def test_pytorch_opinfo_householder_product_samples(dtype, op_db):
    for sample in op_db["linalg.householder_product"].sample_inputs("cpu", dtype):
        want = torch.linalg.householder_product(sample.input, *sample.args)
        with mps_ext.overrides.enabled("cpu"), mps_ext.trace() as t:
            got = torch.linalg.householder_product(sample.input, *sample.args)
        if got.numel():
            assert t.names == [f"qr_householder_simd_{MTYPE[dtype]}"], sample
        assert got.shape == want.shape and got.stride() == want.stride()
        assert_close_normwise(got, want)  # products of reflectors with OpInfo's random tau


@pytest.mark.parametrize("mode", MODES)
def test_opcheck(mode):
    # The fake kernels give the kernels' shapes and layouts; schema, autograd registration, dynamic shapes.
    A = randn(2, 6, 4, dtype=torch.complex64)
    utils = ("test_schema", "test_faketensor", "test_aot_dispatch_dynamic") if mode != "r" else ("test_faketensor",)
    torch.library.opcheck(torch.ops.mps_ext.qr, (A, mode), test_utils=utils)
    torch.library.opcheck(torch.ops.mps_ext.qr, (A.real.contiguous().mT, mode), test_utils=("test_faketensor",))
    QR, tau = torch.geqrf(A)
    torch.library.opcheck(torch.ops.mps_ext.householder_product, (QR, tau))


def test_checked_mode():
    with mps_ext.sim.checked():
        for dtype in DTYPES:
            for shape in ((3, 5, 4), (2, 37, 40)):
                A = randn(*shape, dtype=dtype, seed=shape[1])
                with mps_ext.trace() as t:
                    got = mps_ext.qr(A, "complete")
                assert t.names == qr_kernels(dtype, "complete")
                assert_same_qr(A, got, torch.linalg.qr(A, "complete"))
        A = randn(1, 64, 64, dtype=torch.complex64)  # fills the 32 KiB of threadgroup memory
        assert_same_qr(A, mps_ext.qr(A), torch.linalg.qr(A))
