"""Small-matrix inverse: mps_ext.inv(_ex) and torch.linalg.inv(_ex) through the
overrides against torch.linalg on the CPU (inverses, info, residuals, singular
input, errors), PyTorch's own OpInfo samples, fake kernels and checked mode.
Views, autograd in both modes and side streams run from the shared tables
(tests/op_cases.py, tests/test_streams.py)."""

import pytest
import torch

import mps_ext
from mps_ext.testing import assert_raises_like
from conftest import on, ran
from op_cases import randn, well_conditioned
from tolerances import assert_close_conditioned, assert_solves

DTYPES = [torch.float32, torch.complex64]
MTYPE = {torch.float32: "float", torch.complex64: "float2"}


def inverse_kernels(n, dtype):
    """The kernel inv runs: one dispatch factors and inverts, a thread per matrix up to order 4, else a SIMD group."""
    return [f"lu_inverse_{'thread' if n <= 4 else 'simd'}_{MTYPE[dtype]}"]


def assert_inverts(A, X):
    """``A X = I`` to the backward error of a solve: the inverse is the solution of A X = I."""
    assert_solves(A, X, torch.eye(A.shape[-1], dtype=A.dtype).expand_as(A))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 16, 33, 64])
def test_inv_matches_torch(n, dtype, device):
    batch = {1: 512, 2: 512, 3: 512, 4: 512, 5: 64, 16: 8, 33: 2, 64: 1}[n]
    A = well_conditioned(batch, n, dtype, seed=n)
    with mps_ext.trace() as t:
        X, info = on(device, mps_ext.inv_ex, A)
    ran(t, device, *inverse_kernels(n, dtype))
    want_X, want_info = torch.linalg.inv_ex(A)
    assert info.dtype == torch.int32 and torch.equal(info, want_info)
    assert X.shape == want_X.shape and X.stride() == want_X.stride()
    assert_close_conditioned(X, want_X, A)
    assert_inverts(A, X)
    assert_close_conditioned(on(device, mps_ext.inv, A[0]), want_X[0], A[0])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [3, 17])
def test_inv_singular(n, dtype, device):
    A = well_conditioned(4, n, dtype, seed=2)
    A[1, :, 1] = 0  # a zero column: info 2
    A[2] = 0  # info 1
    X, info = on(device, mps_ext.inv_ex, A)
    want_X, want_info = torch.linalg.inv_ex(A)
    assert torch.equal(info, want_info) and info.tolist() == [0, 2, 1, 0]
    # As torch's: the singular matrices' inverses hold infs or NaNs, the others are right.
    assert not X[1:3].isfinite().all(dim=(-2, -1)).any() and not want_X[1:3].isfinite().all(dim=(-2, -1)).any()
    assert_close_conditioned(X[[0, 3]], want_X[[0, 3]], A[[0, 3]])
    for call in (lambda m, x: m.inv(x), lambda m, x: m.inv_ex(x, check_errors=True)):
        for x in (A, A[1]):
            with pytest.raises(torch.linalg.LinAlgError) as theirs:
                call(torch.linalg, x)
            with pytest.raises(torch.linalg.LinAlgError) as ours:
                on(device, call, mps_ext, x)
            assert str(ours.value) == str(theirs.value)


def test_inv_views_broadcast_shapes_and_empty(device):
    A = well_conditioned(6, 7, torch.complex64, seed=3)
    for a in (A.mT, A.conj(), A[::2], A[:1].expand(3, 7, 7), A.unsqueeze(0).expand(2, 6, 7, 7)):
        X = on(device, mps_ext.inv, a)
        want = torch.linalg.inv(a.resolve_conj())
        assert X.shape == want.shape and X.stride() == want.stride()
        assert_close_conditioned(X, want, a.resolve_conj())
    for shape in ((0, 3, 3), (2, 0, 0), (0, 0)):
        with mps_ext.trace() as t:
            X, info = on(device, mps_ext.inv_ex, torch.zeros(shape))
        want_X, want_info = torch.linalg.inv_ex(torch.zeros(shape))
        assert t.kernels == [] and X.shape == want_X.shape and torch.equal(info, want_info)


BAD_CALLS = [
    lambda m: m.inv(torch.randn(3)),
    lambda m: m.inv(torch.randn(3, 4)),
    lambda m: m.inv(torch.ones(3, 3, dtype=torch.int32)),
    lambda m: m.inv_ex(torch.randn(2, 4, 3)),
]


@pytest.mark.fallback("not a matrix|not square|dtype Int")  # torch raises
@pytest.mark.parametrize("i", range(len(BAD_CALLS)))
def test_bad_input_raises_like_torch(i):
    assert_raises_like(lambda: BAD_CALLS[i](mps_ext), lambda: BAD_CALLS[i](torch.linalg))


class TestOverrides:
    def test_torch_linalg_inv_runs_the_kernels(self):
        A, B = well_conditioned(8, 3, seed=1), well_conditioned(2, 20, torch.complex64, seed=2)
        mps_ext.overrides.reset_stats()
        with mps_ext.overrides.enabled("cpu"), mps_ext.trace() as t:
            X = torch.linalg.inv(A)
            Y, info = torch.linalg.inv_ex(B)
        ran(t, "cpu", *inverse_kernels(3, torch.float32), *inverse_kernels(20, torch.complex64))
        assert_close_conditioned(X, torch.linalg.inv(A), A)
        assert_close_conditioned(Y, torch.linalg.inv(B), B)
        assert mps_ext.overrides.stats()["aten::linalg_inv_ex"] == {"hits": 2, "fallbacks": 0, "reasons": {}}

    @pytest.mark.fallback("order above 64|dtype Double")
    def test_fallbacks_are_counted_with_the_reason(self):
        large, double = well_conditioned(1, 65), well_conditioned(2, 3).double()
        mps_ext.overrides.reset_stats()
        with mps_ext.overrides.enabled("cpu"), mps_ext.trace() as t:
            X = torch.linalg.inv(large)
            torch.linalg.inv(double)
        assert t.kernels == [] and X.shape == (1, 65, 65)
        assert mps_ext.overrides.stats()["aten::linalg_inv_ex"]["reasons"] == {"order above 64": 1, "dtype Double": 1}

    def test_singular_raises_torchs_error(self):
        A = torch.zeros(2, 3, 3)
        with pytest.raises(torch.linalg.LinAlgError) as theirs:
            torch.linalg.inv(A)
        with mps_ext.overrides.enabled("cpu"), pytest.raises(torch.linalg.LinAlgError) as ours:
            torch.linalg.inv(A)
        assert str(ours.value) == str(theirs.value)


@pytest.fixture(scope="module")
def op_db():
    from torch.testing._internal.common_methods_invocations import op_db
    return {op.name: op for op in op_db}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["linalg.inv", "linalg.inv_ex"])
def test_pytorch_opinfo_samples(name, dtype, op_db):
    opinfo = op_db[name]
    samples = list(opinfo.sample_inputs("cpu", dtype))
    assert samples
    for sample in samples:
        want = opinfo.op(sample.input, *sample.args, **sample.kwargs)
        with mps_ext.overrides.enabled("cpu"), mps_ext.trace() as t:
            got = opinfo.op(sample.input, *sample.args, **sample.kwargs)
        got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
        if sample.input.numel():
            assert t.names == inverse_kernels(sample.input.shape[-1], dtype), sample
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape and g.dtype == w.dtype, sample
            if g.is_floating_point() or g.is_complex():
                assert_close_conditioned(g, w, sample.input)
            else:
                assert torch.equal(g, w), sample


def test_opcheck():
    # The fake kernel gives the kernels' shapes and layouts; schema, autograd registration, dynamic shapes.
    A = well_conditioned(2, 5, torch.complex64)
    torch.library.opcheck(torch.ops.mps_ext.inv_ex, (A,))
    torch.library.opcheck(torch.ops.mps_ext.inv_ex, (A.real.contiguous(),), test_utils=("test_faketensor",))


def test_checked_mode():
    with mps_ext.sim.checked():
        for dtype in DTYPES:
            for n in (4, 37):
                A = well_conditioned(3, n, dtype, seed=n)
                with mps_ext.trace() as t:
                    X = mps_ext.inv(A)
                assert t.names == inverse_kernels(n, dtype)
                assert_close_conditioned(X, torch.linalg.inv(A), A)
