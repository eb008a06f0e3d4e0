"""Small-matrix linear algebra: mps_ext.lu_factor(_ex), lu_solve, solve and
solve_triangular against torch.linalg on the CPU (factors, pivots, info,
solutions, residuals), the aten overrides, gradients, fake kernels and checked
mode."""

import pytest
import torch

import mps_ext
from mps_ext.testing import assert_raises_like
from conftest import on, ran
from op_cases import randn, well_conditioned
from tolerances import (assert_close, assert_close_conditioned, assert_lu_backward_stable, assert_solve_backward_stable,
                        assert_solves)

DTYPES = [torch.float32, torch.complex64]
ORDERS = [1, 2, 3, 4, 5, 8, 16, 17, 32, 64]
MTYPE = {torch.float32: "float", torch.complex64: "float2"}


def batch_for(n: int) -> int:
    """Thousands of tiny systems, fewer large ones (sized for the simulator)."""
    return {1: 4096, 2: 4096, 3: 2048, 4: 2048, 5: 256, 8: 256, 16: 64, 17: 48, 32: 16, 64: 6}[n]


def triangle(batch, n, dtype, upper, unit, seed=0):
    """A well-conditioned triangle (Gaussian triangles are not): small
    off-diagonal entries, diagonal away from zero; garbage in the other half,
    which must not be read."""
    A = randn(*batch, n, n, dtype=dtype, seed=seed) / n ** 0.5
    A.diagonal(dim1=-2, dim2=-1).add_(torch.where(randn(*batch, n, seed=seed + 1) > 0, 1.5, -1.5))
    other = torch.full_like(A, float("nan"))
    keep = torch.ones(n, n, dtype=torch.bool).triu() if upper else torch.ones(n, n, dtype=torch.bool).tril()
    A = torch.where(keep, A, other)
    if unit:
        A.diagonal(dim1=-2, dim2=-1).fill_(float("nan"))
    return A


def triangle_read(A, upper, unit):
    """The matrix solve_triangular solves with: ``A``'s triangle, ones on the diagonal when ``unit``."""
    T = A.triu() if upper else A.tril()
    if unit:
        T.diagonal(dim1=-2, dim2=-1).fill_(1)
    return T


def tiny(n):
    return n <= 4


# --- LU factorization ---------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", ORDERS)
def test_lu_factor_matches_torch(n, dtype, device):
    A = randn(batch_for(n), n, n, dtype=dtype, seed=n)
    with mps_ext.trace() as t:
        LU, pivots, info = on(device, mps_ext.lu_factor_ex, A)
    ran(t, device, f"lu_factor_{'thread' if tiny(n) else 'simd'}_{MTYPE[dtype]}")
    want_LU, want_pivots, want_info = torch.linalg.lu_factor_ex(A)
    assert pivots.dtype == torch.int32 and info.dtype == torch.int32
    assert torch.equal(pivots, want_pivots)
    assert torch.equal(info, want_info) and not info.any()
    assert LU.shape == want_LU.shape and LU.stride() == want_LU.stride()
    assert_close_conditioned(LU, want_LU, A)
    assert_lu_backward_stable(LU, pivots, A)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [3, 17])
def test_lu_factor_singular(n, dtype, device):
    A = randn(5, n, n, dtype=dtype, seed=1)
    A[0] = 0  # info 1
    A[1, :, 1] = 0  # a zero column: info 2
    A[2, :, n - 1] = A[2, :, 0]  # equal columns: U[n-1, n-1] exactly zero in exact arithmetic
    A[3, 1] = 2 * A[3, 0]  # dependent rows
    with mps_ext.trace() as t:
        LU, pivots, info = on(device, mps_ext.lu_factor_ex, A)
    ran(t, device, f"lu_factor_{'thread' if tiny(n) else 'simd'}_{MTYPE[dtype]}")
    want_LU, want_pivots, want_info = torch.linalg.lu_factor_ex(A)
    assert info[0] == 1 and info[1] == 2 and info[4] == 0
    assert torch.equal(info[:2], want_info[:2]) and torch.equal(pivots[:2], want_pivots[:2])
    assert_close(LU[:2], want_LU[:2], scale=n)  # singular, no condition number: each entry sums n roundings
    # The factorization goes on past a zero pivot: P L U is still A.
    assert_lu_backward_stable(LU, pivots, A)
    # lu_factor raises like torch.
    for x in (A[1], A[:2]):
        assert_raises_like(lambda: on(device, mps_ext.lu_factor, x), lambda: torch.linalg.lu_factor(x))
    with pytest.raises(RuntimeError, match="lu_factor_ex"):
        on(device, mps_ext.lu_factor_ex, A, check_errors=True)


@pytest.mark.parametrize("n", [4, 8, 33])
def test_pivot_ties_go_to_the_first_row(n, device):
    # Small integers: exact arithmetic, many candidates of equal magnitude.
    g = torch.Generator().manual_seed(n)
    A = (torch.randint(-2, 3, (64, n, n), generator=g) * torch.randint(1, 3, (64, 1, n), generator=g)).float()
    A[:, :, 0] = torch.tensor([1.0, -1.0] * n)[:n]  # |a| ties everywhere in column 0
    LU, pivots, info = on(device, mps_ext.lu_factor_ex, A)
    want_LU, want_pivots, want_info = torch.linalg.lu_factor_ex(A)
    assert torch.equal(pivots, want_pivots) and torch.equal(info, want_info)
    assert (pivots[:, 0] == 1).all()


@pytest.mark.parametrize("n", [3, 9])
def test_complex_pivots_compare_abs_re_plus_abs_im(n, device):
    # |1+1j| < |2| but |re|+|im| ties (2 = 2): LAPACK's icamax keeps the first.
    A = randn(4, n, n, dtype=torch.complex64, seed=3) * 0.1
    A[:, 0, 0] = 1 + 1j
    A[:, 1, 0] = 2
    A[1, 0, 0], A[1, 1, 0], A[1, 2, 0] = 0.5 + 0.5j, 0.1, -1.5 + 0.25j  # |re|+|im|: 1, 0.1, 1.75
    LU, pivots, _ = on(device, mps_ext.lu_factor_ex, A)
    want_LU, want_pivots, _ = torch.linalg.lu_factor_ex(A)
    assert torch.equal(pivots, want_pivots)
    assert pivots[0, 0] == 1 and pivots[1, 0] == 3
    assert_close_conditioned(LU, want_LU, A)


@pytest.mark.parametrize("n", [3, 9])
def test_nan_and_inf(n, device):
    A = randn(4, n, n, seed=n)
    A[0, 1, 1] = float("nan")  # reaches later pivot columns through the updates
    A[1, 0, 0] = float("inf")
    A[2, :, 0] = float("nan")
    B = randn(4, n, 2, seed=1)
    LU, pivots, info = on(device, mps_ext.lu_factor_ex, A)
    want_LU, want_pivots, want_info = torch.linalg.lu_factor_ex(A)
    assert torch.equal(pivots, want_pivots) and torch.equal(info, want_info)
    assert torch.equal(LU.isnan(), want_LU.isnan())
    X, info = on(device, mps_ext.solve_ex, A, B)
    want_X, _ = torch.linalg.solve_ex(A, B)
    assert torch.equal(X.isnan(), want_X.isnan()) and X[[0, 2]].isnan().all()
    assert_close_conditioned(X[3], want_X[3], A[3])
    assert_solves(A[3], X[3], B[3])


# --- solve ----------------------------------------------------------------------


@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", ORDERS)
def test_solve_matches_torch(n, dtype, left, device):
    batch = batch_for(n) // (4 if n > 4 else 1)
    A = well_conditioned(batch, n, dtype, seed=n)
    B = randn(batch, *((n, 3) if left else (3, n)), dtype=dtype, seed=n + 1)
    with mps_ext.trace() as t:
        X, LU, pivots, info = on(device, torch.ops.mps_ext.solve_ex, A, B, left=left)
    kind = MTYPE[dtype]
    if tiny(n):
        ran(t, device, f"lu_solve_fused_thread_{kind}")  # one dispatch factors and solves
    else:
        ran(t, device, f"lu_factor_simd_{kind}", f"lu_solve_simd_{kind}")
    want_X, want_LU, want_pivots, want_info = torch.ops.aten._linalg_solve_ex(A, B, left=left)
    assert torch.equal(pivots, want_pivots) and torch.equal(info, want_info)
    assert_close_conditioned(LU, want_LU, A)
    assert X.shape == want_X.shape and X.stride() == want_X.stride()
    assert_close_conditioned(X, want_X, A)
    assert_solves(A, X, B, left)
    assert_solve_backward_stable(A, X, B, LU, pivots, left)
    assert_close_conditioned(on(device, mps_ext.solve, A, B, left=left), want_X, A)


@pytest.mark.parametrize("dtype", DTYPES)
def test_solve_vectors_and_broadcasting(dtype, device):
    A = well_conditioned(3, 5, dtype).unsqueeze(1)
    for B in (randn(5, dtype=dtype), randn(3, 1, 5, dtype=dtype), randn(4, 5, 2, dtype=dtype),
              randn(2, 3, 4, 5, 1, dtype=dtype)):
        with mps_ext.trace() as t:
            got = on(device, mps_ext.solve, A, B)
        assert t.names[-1] == f"lu_solve_simd_{MTYPE[dtype]}"
        assert_solves(A, got, B)
        want = torch.linalg.solve(A, B)
        vector = B.dim() == 1 or B.shape == A.shape[:-1]  # vectors, by torch.linalg.solve's rule
        assert_close_conditioned(got.unsqueeze(-1) if vector else got, want.unsqueeze(-1) if vector else want, A)
    A = well_conditioned(2, 3, dtype)
    got = on(device, mps_ext.solve, A, randn(2, 3, dtype=dtype))  # a batch of vectors
    assert_solves(A, got, randn(2, 3, dtype=dtype))
    assert_close_conditioned(got.unsqueeze(-1), torch.linalg.solve(A, randn(2, 3, dtype=dtype)).unsqueeze(-1), A)
    # A's batch broadcast over B's: the tiny factor and solve kernels run apart.
    with mps_ext.trace() as t:
        got = on(device, mps_ext.solve, A[0], randn(6, 3, 2, dtype=dtype))
    ran(t, device, f"lu_factor_thread_{MTYPE[dtype]}", f"lu_solve_thread_{MTYPE[dtype]}")
    assert_close_conditioned(got, torch.linalg.solve(A[0], randn(6, 3, 2, dtype=dtype)), A[0])


@pytest.mark.parametrize("n", [3, 17])
def test_solve_singular_and_near_singular(n, device):
    A = randn(4, n, n, seed=5)
    A[1, :, 2] = 0
    B = randn(4, n, 2, seed=6)
    X, info = on(device, mps_ext.solve_ex, A, B)
    want_X, want_info = torch.linalg.solve_ex(A, B)
    assert torch.equal(info, want_info) and info[1] == 3
    assert_close_conditioned(X[[0, 2, 3]], want_X[[0, 2, 3]], A[[0, 2, 3]])
    assert_solves(A[[0, 2, 3]], X[[0, 2, 3]], B[[0, 2, 3]])
    with pytest.raises(torch.linalg.LinAlgError) as ours:
        on(device, mps_ext.solve, A, B)
    with pytest.raises(torch.linalg.LinAlgError) as theirs:
        torch.linalg.solve(A, B)
    assert str(ours.value) == str(theirs.value)
    # Nearly singular: a tiny pivot (far above float's smallest normal) still solves.
    A = randn(n, n, seed=7)
    A[:, -1] = A[:, 0] + 1e-4 * randn(n, seed=8)
    B = randn(n, 1, seed=9)
    X, info = on(device, mps_ext.solve_ex, A, B)
    assert info == 0
    assert_solves(A, X, B)
    # Subnormal pivots are divided by, not multiplied with their (infinite) reciprocal.
    A = torch.eye(n) * 1e-39
    X, info = on(device, mps_ext.solve_ex, A, torch.full((n, 1), 1e-39))
    assert info == 0 and torch.allclose(X, torch.ones(n, 1), rtol=1e-3)


# --- lu_solve -------------------------------------------------------------------


@pytest.mark.parametrize("adjoint", [False, True])
@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 3, 4, 5, 17, 40])
def test_lu_solve_variants(n, dtype, left, adjoint, device):
    A = well_conditioned(6, n, dtype, seed=n)
    LU, pivots = torch.linalg.lu_factor(A)  # torch's factors: only the solve is compared
    B = randn(6, *((n, 4) if left else (4, n)), dtype=dtype, seed=2)
    with mps_ext.trace() as t:
        X = on(device, mps_ext.lu_solve, LU, pivots, B, left=left, adjoint=adjoint)
    ran(t, device, f"lu_solve_{'thread' if tiny(n) else 'simd'}_{MTYPE[dtype]}")
    want = torch.linalg.lu_solve(LU, pivots, B, left=left, adjoint=adjoint)
    assert X.shape == want.shape and X.stride() == want.stride()
    assert_close_conditioned(X, want, A)
    assert_solves(A, X, B, left, adjoint)
    assert_solve_backward_stable(A, X, B, LU, pivots, left, adjoint)


def test_lu_solve_complex_residual_and_broadcasting(device):
    A = well_conditioned(2, 12, torch.complex64, seed=4).unsqueeze(1)
    B = randn(3, 12, 5, dtype=torch.complex64, seed=5)
    LU, pivots = on(device, mps_ext.lu_factor, A)
    X = on(device, mps_ext.lu_solve, LU, pivots, B)
    assert X.shape == (2, 3, 12, 5)
    assert_solve_backward_stable(A, X, B, LU, pivots)
    assert_close_conditioned(X, torch.linalg.lu_solve(*torch.linalg.lu_factor(A), B), A)


# --- solve_triangular -------------------------------------------------------------


@pytest.mark.parametrize("unit", [False, True])
@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("upper", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,k", [(1, 1), (3, 2), (5, 9), (16, 8), (17, 8), (32, 3), (32, 12), (64, 64)])
def test_solve_triangular_matches_torch(n, k, dtype, upper, left, unit, device):
    A = triangle((3,), n, dtype, upper, unit, seed=n)
    B = randn(3, *((n, k) if left else (k, n)), dtype=dtype, seed=k)
    with mps_ext.trace() as t:
        X = on(device, mps_ext.solve_triangular, A, B, upper=upper, left=left, unitriangular=unit)
    inverse = dtype == torch.float32 and n in (16, 32, 64) and k >= 8
    ran(t, device, "trsm_inverse_float" if inverse else f"trsm_simd_{MTYPE[dtype]}")
    want = torch.linalg.solve_triangular(A, B, upper=upper, left=left, unitriangular=unit)
    assert X.shape == want.shape and not X.isnan().any()
    T = triangle_read(A, upper, unit)
    assert_close_conditioned(X, want, T)
    assert_solves(T, X, B, left)


def test_gated_deltanet_shape(device):
    # Chunked Gated DeltaNet: (I + strictly lower) X = B per head and chunk, 64 x 64, 64 right-hand sides.
    A = torch.tril(randn(2, 4, 64, 64, seed=11) * 0.05, -1) + torch.eye(64)
    B = randn(2, 4, 64, 64, seed=12)
    with mps_ext.trace() as t:
        X = on(device, mps_ext.solve_triangular, A, B, upper=False, unitriangular=True)
    ran(t, device, "trsm_inverse_float")
    assert t.kernels[0].grid == (8, 1, 1) and t.kernels[0].threadgroup == (64, 1, 1)
    assert_close_conditioned(X, torch.linalg.solve_triangular(A, B, upper=False, unitriangular=True), A)
    assert_solves(A, X, B)


def test_solve_triangular_broadcasting_and_strides(device):
    A = triangle((1,), 20, torch.float32, True, False).expand(4, 20, 20)  # one triangle, stride 0
    B = randn(4, 15, 50)[:, :, 3:43:2].transpose(-2, -1)  # non-contiguous (20 x 15)
    with mps_ext.trace() as t:
        X = on(device, mps_ext.solve_triangular, A, B, upper=True)
    ran(t, device, "trsm_simd_float")
    assert_close_conditioned(X, torch.linalg.solve_triangular(A, B, upper=True), A.triu())
    assert_solves(A.triu(), X, B)


# --- shared semantics -------------------------------------------------------------


def test_non_contiguous_and_conjugated_inputs(device):
    A = well_conditioned(4, 9, torch.complex64, seed=2)
    B = randn(4, 9, 3, dtype=torch.complex64, seed=3)
    for a in (A.mT, A.conj(), A[:, ::1, :].transpose(1, 2).conj()):
        X = on(device, mps_ext.solve, a, B)
        assert_solves(a.resolve_conj(), X, B)
        assert_close_conditioned(X, torch.linalg.solve(a.resolve_conj(), B), a.resolve_conj())
        assert torch.equal(on(device, mps_ext.lu_factor, a)[1], torch.linalg.lu_factor(a.resolve_conj())[1])
    x = randn(3, 10, 20)[:, :, ::2]
    assert_close_conditioned(on(device, mps_ext.lu_factor, x)[0], torch.linalg.lu_factor(x)[0], x)


def test_empty_inputs(device):
    for shape in ((0, 3, 3), (2, 0, 0)):
        A = torch.zeros(shape)
        with mps_ext.trace() as t:
            LU, pivots, info = on(device, mps_ext.lu_factor_ex, A)
            X = on(device, mps_ext.solve_triangular, A, torch.zeros(*shape[:2], 2), upper=True)
            Y = on(device, mps_ext.lu_solve, LU, pivots, torch.zeros(*shape[:2], 2))
        want = torch.linalg.lu_factor_ex(A)
        assert t.kernels == [] and LU.shape == want[0].shape and pivots.shape == want[1].shape
        assert torch.equal(info, want[2]) and X.shape == Y.shape == (*shape[:2], 2)
    # No right-hand sides: torch still factors A, and so do the kernels.
    A = randn(2, 3, 3)
    with mps_ext.trace() as t:
        X, LU, pivots, info = on(device, torch.ops.mps_ext.solve_ex, A, torch.zeros(2, 3, 0))
    ran(t, device, "lu_factor_thread_float")
    want = torch.ops.aten._linalg_solve_ex(A, torch.zeros(2, 3, 0))
    assert X.shape == want[0].shape and torch.equal(pivots, want[2])
    assert_close_conditioned(LU, want[1], A)


BAD_CALLS = [
    ("lu_factor", lambda m, t: m.lu_factor(torch.randn(3))),
    ("solve", lambda m, t: m.solve(torch.randn(3, 3), torch.randn(4, 1))),
    ("solve", lambda m, t: m.solve(torch.randn(3, 4), torch.randn(3, 1))),
    ("solve", lambda m, t: m.solve(torch.randn(3, 3), torch.randn(3, 1, dtype=torch.complex64))),
    ("solve", lambda m, t: m.solve(torch.randn(2, 3, 3), torch.randn(3), left=False)),
    ("solve", lambda m, t: m.solve(torch.randn(2, 3, 3), torch.randn(4, 3, 1))),
    ("solve_triangular", lambda m, t: m.solve_triangular(torch.randn(3, 3), torch.randn(3), upper=True)),
    ("solve_triangular", lambda m, t: m.solve_triangular(torch.randn(3, 3), torch.randn(4, 2), upper=True)),
    ("lu_solve", lambda m, t: m.lu_solve(*t.linalg.lu_factor(torch.randn(3, 3)), torch.randn(4, 2))),
    ("lu_solve", lambda m, t: m.lu_solve(t.linalg.lu_factor(torch.randn(3, 3))[0],
                                         torch.tensor([1, 2, 3]), torch.randn(3, 2))),
    ("lu_solve", lambda m, t: m.lu_solve(t.linalg.lu_factor(torch.randn(3, 3))[0],
                                         torch.tensor([1, 4, 3], dtype=torch.int32), torch.randn(3, 2))),
    ("lu_solve", lambda m, t: m.lu_solve(t.linalg.lu_factor(torch.randn(3, 3))[0],
                                         torch.tensor([0, 2, 3], dtype=torch.int32), torch.randn(3, 2))),
]


@pytest.mark.fallback("not a matrix|shapes|not square|dtypes differ|pivots out of range")  # torch raises
@pytest.mark.parametrize("i", range(len(BAD_CALLS)))
def test_bad_input_raises_like_torch(i):
    _, call = BAD_CALLS[i]
    seeded = lambda ns: lambda: (torch.manual_seed(i), call(ns, torch))
    assert_raises_like(seeded(mps_ext), seeded(torch.linalg))


@pytest.mark.fallback("dtype Double|not square|order above 64")
def test_other_dtypes_and_large_orders_go_to_torch():
    for A in (randn(4, 4).double(), randn(65, 65), randn(3, 5)):
        with mps_ext.trace() as t:
            got = mps_ext.lu_factor_ex(A)
        assert t.kernels == []
        for g, w in zip(got, torch.linalg.lu_factor_ex(A)):
            assert torch.equal(g, w)


# --- overrides, autograd, fake kernels, checked mode -------------------------------


class TestOverrides:
    def test_torch_linalg_runs_the_kernels(self):
        A, B = randn(8, 3, 3, seed=1), randn(8, 3, 2, seed=2)
        T = triangle((8,), 16, torch.float32, False, False)
        mps_ext.overrides.reset_stats()
        with mps_ext.overrides.enabled("cpu"), mps_ext.trace() as t:
            X = torch.linalg.solve(A, B)
            LU, pivots = torch.linalg.lu_factor(A)
            Y = torch.linalg.lu_solve(LU, pivots, B, adjoint=True)
            Z = torch.linalg.solve_triangular(T, randn(8, 16, 8), upper=False)
        ran(t, "cpu", "lu_solve_fused_thread_float", "lu_factor_thread_float", "lu_solve_thread_float", "trsm_inverse_float")
        assert_close_conditioned(X, torch.linalg.solve(A, B), A)
        assert_close_conditioned(Y, torch.linalg.lu_solve(*torch.linalg.lu_factor(A), B, adjoint=True), A)
        assert_close_conditioned(Z, torch.linalg.solve_triangular(T, randn(8, 16, 8), upper=False), T.tril())
        stats = mps_ext.overrides.stats()
        for op in ("aten::_linalg_solve_ex", "aten::linalg_lu_factor_ex", "aten::linalg_lu_solve",
                   "aten::linalg_solve_triangular"):
            assert stats[op]["hits"] == 1 and stats[op]["fallbacks"] == 0, op

    @pytest.mark.fallback("order above 64|dtype Double|not square")
    def test_fallbacks_are_counted_with_the_reason(self):
        mps_ext.overrides.reset_stats()
        with mps_ext.overrides.enabled("cpu"), mps_ext.trace() as t:
            X = torch.linalg.solve(randn(2, 65, 65), randn(2, 65, 1))
            torch.linalg.lu_factor(randn(3, 3).double())
            torch.linalg.lu_factor(randn(3, 5))
        assert t.kernels == [] and X.shape == (2, 65, 1)
        stats = mps_ext.overrides.stats()
        assert stats["aten::_linalg_solve_ex"]["reasons"] == {"order above 64": 1}
        assert stats["aten::linalg_lu_factor_ex"]["reasons"] == {"dtype Double": 1, "not square": 1}

    @pytest.mark.fallback("pivots out of range|shapes")
    def test_errors_are_torchs(self):
        with mps_ext.overrides.enabled("cpu"):
            with pytest.raises(torch.linalg.LinAlgError, match="singular"):
                torch.linalg.solve(torch.zeros(2, 3, 3), randn(3))
            with pytest.raises(RuntimeError, match="Incompatible shapes"):
                torch.linalg.solve_triangular(randn(3, 3), randn(4, 2), upper=True)
            with pytest.raises(RuntimeError, match="Pivots given to lu_solve"):
                torch.linalg.lu_solve(randn(3, 3), torch.zeros(3, dtype=torch.int32), randn(3, 1))

    @pytest.mark.parametrize("dtype", DTYPES)
    @pytest.mark.parametrize("n", [3, 9])
    def test_gradients_through_torch_linalg(self, n, dtype):
        A0 = randn(4, n, n, dtype=dtype, seed=1) + 2 * torch.eye(n)
        B0 = randn(4, n, 2, dtype=dtype, seed=2)
        W = randn(4, n, 2, dtype=dtype, seed=3)

        def grads():
            A, B = A0.clone().requires_grad_(), B0.clone().requires_grad_()
            X = torch.linalg.solve(A, B)
            Y = torch.linalg.lu_solve(*torch.linalg.lu_factor(A), B, left=True, adjoint=True)
            Z = torch.linalg.solve_triangular(A, B, upper=True)
            ((X + Y + Z) * W).real.sum().backward()
            return A.grad, B.grad

        want = grads()
        with mps_ext.overrides.enabled("cpu"), mps_ext.trace() as t:
            got = grads()
        assert f"lu_solve_{'thread' if n <= 4 else 'simd'}_{MTYPE[dtype]}" in t.names  # backward ran kernels
        for g, w in zip(got, want):
            assert_close_conditioned(g, w, A0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gradients_of_the_mps_ext_functions(dtype):
    A0 = randn(3, 6, 6, dtype=dtype, seed=1) + 2 * torch.eye(6)
    B0 = randn(3, 6, 2, dtype=dtype, seed=2)
    fns = {
        "solve": (mps_ext.solve, torch.linalg.solve),
        "solve_triangular": (lambda a, b: mps_ext.solve_triangular(a, b, upper=False, left=True),
                             lambda a, b: torch.linalg.solve_triangular(a, b, upper=False, left=True)),
        "lu_factor": (lambda a, b: mps_ext.lu_factor(a)[0], lambda a, b: torch.linalg.lu_factor(a)[0]),
        "lu_solve": (lambda a, b: mps_ext.lu_solve(*mps_ext.lu_factor(a), b, adjoint=True),
                     lambda a, b: torch.linalg.lu_solve(*torch.linalg.lu_factor(a), b, adjoint=True)),
    }
    for name, (ours, theirs) in fns.items():
        results = []
        for f in (ours, theirs):
            A, B = A0.clone().requires_grad_(), B0.clone().requires_grad_()
            f(A, B).abs().sum().backward()
            results.append((A.grad, B.grad))
        for g, w in zip(*results):
            if w is None:
                assert g is None or not g.any(), name
            else:
                assert_close_conditioned(g, w, A0)


OPCHECK_CASES = {
    "lu_factor_ex": lambda A, B, LU, p: (torch.ops.mps_ext.lu_factor_ex, (A,), {}),
    "lu_solve": lambda A, B, LU, p: (torch.ops.mps_ext.lu_solve, (LU, p, B.mT), {"left": False, "adjoint": True}),
    "solve_ex": lambda A, B, LU, p: (torch.ops.mps_ext.solve_ex, (A, B), {}),
    "solve_ex vector": lambda A, B, LU, p: (torch.ops.mps_ext.solve_ex, (A, B[..., 0]), {}),
    "solve_triangular": lambda A, B, LU, p: (torch.ops.mps_ext.solve_triangular, (A, B.mT),
                                             {"upper": False, "left": False, "unitriangular": True}),
}


@pytest.mark.parametrize("case", OPCHECK_CASES)
def test_opcheck(case):
    # Fake kernels give the kernels' shapes and layouts; schema, autograd registration, dynamic shapes.
    A = randn(2, 5, 5, dtype=torch.complex64) + 3 * torch.eye(5)
    B = randn(2, 5, 3, dtype=torch.complex64)
    op, args, kwargs = OPCHECK_CASES[case](A, B, *torch.linalg.lu_factor(A))
    torch.library.opcheck(op, args, kwargs)
    args = tuple(a.real.contiguous() if a.is_complex() else a for a in args)  # float32 too
    torch.library.opcheck(op, args, kwargs, test_utils=("test_faketensor",))


def test_checked_mode_on_every_kernel():
    ran_kernels = set()
    with mps_ext.sim.checked():
        for dtype in DTYPES:
            for n in (3, 37):
                A = randn(3, n, n, dtype=dtype, seed=n)
                B = randn(3, n, 2, dtype=dtype, seed=1)
                with mps_ext.trace() as t:
                    LU, pivots = mps_ext.lu_factor(A)
                    X = mps_ext.solve(A, B)
                    Y = mps_ext.lu_solve(LU, pivots, B, adjoint=True)
                    Z = mps_ext.solve_triangular(A, B, upper=True)
                    mps_ext.solve(A[0], B)  # broadcast A: factor and solve apart
                    W = mps_ext.inv(A)
                ran_kernels.update(t.names)
                assert_close_conditioned(X, torch.linalg.solve(A, B), A)
                assert_close_conditioned(Y, torch.linalg.lu_solve(LU, pivots, B, adjoint=True), A)
                assert_close_conditioned(Z, torch.linalg.solve_triangular(A, B, upper=True), A.triu())
                assert_solves(A, X, B)
                assert_solves(A, Y, B, adjoint=True)
                assert_solves(A.triu(), Z, B)
                assert_close_conditioned(W, torch.linalg.inv(A), A)
        # A complex 64 x 64 matrix fills the 32 KiB of threadgroup memory exactly.
        A = randn(1, 64, 64, dtype=torch.complex64)
        with mps_ext.trace() as t:
            LU, pivots = mps_ext.lu_factor(A)
        ran_kernels.update(t.names)
        assert torch.equal(pivots, torch.linalg.lu_factor(A)[1])
        T = triangle((2,), 16, torch.float32, False, True)
        with mps_ext.trace() as t:
            mps_ext.solve_triangular(T, randn(2, 16, 9), upper=False, unitriangular=True)
        ran_kernels.update(t.names)
    every = {k for k in mps_ext._C._sim_builtin_kernels() if k.startswith(("lu_", "trsm_"))}
    assert ran_kernels == every
