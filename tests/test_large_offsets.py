"""Views whose elements lie 2^32 or more elements apart in their storage, for every family: the host plans
pass 64-bit strides and the kernels index with 64-bit offsets (a 32-bit stride, or a 32-bit product of a
row and a stride, reads other rows). The views sit in storage the host never touches beyond their elements
(an untouched allocation takes address space, not memory), and run in the simulator's checked mode, which
copies only their elements. CPU tensors only: on a GPU such a storage is as large as it says."""

import pytest
import torch
import torch.nn.functional as F

import mps_ext
from mps_ext import fp8
from op_cases import randn, triangular, well_conditioned
from tolerances import assert_close

FAR = 2**32 + 16  # elements between two rows: past what 32 bits hold
HALF_FAR = 2**31 + 8  # with 3 or more rows, the last row is past 2^32 (2 * HALF_FAR)
SPAN = 2**32 + 2**16


@pytest.fixture(scope="module")
def storage():
    """One untouched storage of SPAN elements per dtype: about SPAN * itemsize bytes of address space."""
    made = {}

    def of(dtype):
        if dtype not in made:
            made[dtype] = torch.empty(SPAN, dtype=dtype)
        return made[dtype]

    return of


@pytest.fixture
def far(storage):
    """far(values, strides): a view of `values`' shape with these strides (in elements) at the start of the
    untouched storage of their dtype, holding `values`."""
    def make(values, strides):
        view = storage(values.dtype).as_strided(values.shape, strides)
        assert max(s * (n - 1) for s, n in zip(strides, values.shape)) >= 2**32
        view.copy_(values)
        return view

    return make


def run(fn, *names):
    """fn() in checked mode, with exactly the kernels `names` run (in the simulator)."""
    with mps_ext.sim.checked(), mps_ext.trace() as t:
        out = fn()
    assert t.names == list(names), t.names
    return out


@pytest.mark.parametrize("rows, stride", [(2, FAR), (3, HALF_FAR), (8, -(-2**32 // 7 // 8) * 8)])
@pytest.mark.parametrize("k_major", [False, True], ids=["row_major", "k_major"])
def test_linear_rows_of_x_far_apart(far, rows, stride, k_major):
    x = far(randn(rows, 72, dtype=torch.float16), (stride, 1))
    w = randn(40, 72, dtype=torch.float16, seed=1)
    weight = w.t().contiguous().t() if k_major else w
    bucket = {2: 2, 3: 4, 8: 8}[rows]
    kernel = f"gemv_t_m{bucket}_half" if k_major else f"gemv_dense_m{bucket}_r{2 if rows > 1 else 1}_half"
    if rows == 8 and not k_major:
        kernel = "gemv_dense_m8_r4_half"
    got = run(lambda: mps_ext.linear(x, weight), kernel)
    assert_close(got, F.linear(x.contiguous().float(), w.float()).half())


def test_linear_rows_of_w_far_apart(far):
    # Row-major weights with rows 2^32 apart (and k-major ones whose k rows are): both GEMV layouts.
    x = randn(1, 24, dtype=torch.bfloat16)
    w = far(randn(2, 24, dtype=torch.bfloat16, seed=1), (FAR, 1))
    got = run(lambda: mps_ext.linear(x, w), "gemv_dense_m1_r2_bfloat")
    assert_close(got, F.linear(x.float(), w.contiguous().float()).bfloat16())
    w_t = far(randn(3, 40, dtype=torch.bfloat16, seed=2), (HALF_FAR, 1)).t()  # (40, 3): its 3 k rows far apart
    x3 = randn(1, 3, dtype=torch.bfloat16)
    got = run(lambda: mps_ext.linear(x3, w_t), "gemv_t_m1_bfloat")
    assert_close(got, F.linear(x3.float(), w_t.contiguous().float()).bfloat16())


def test_softmax_rows_far_apart(far):
    x = far(randn(3, 100, dtype=torch.float16), (HALF_FAR, 1))
    got = run(lambda: mps_ext.softmax(x, -1), "softmax_simd_half_half")
    assert_close(got, torch.softmax(x.contiguous().float(), -1).half())


def test_fp8_linear_rows_far_apart(far):
    q, scale = fp8.quantize(randn(2, 64, seed=1), dim=1)
    x = far(randn(3, 64, dtype=torch.bfloat16), (HALF_FAR, 1))
    w = far(q, (FAR, 1))  # the rows of the e4m3fn weight 2^32 bytes apart
    got = run(lambda: mps_ext.fp8_linear(x, w, scale), "fp8_linear_gemv_m4_bfloat")
    want = F.linear(x.contiguous().float(), fp8.dequantize(w.contiguous(), scale))
    assert_close(got, want.bfloat16())


def test_scaled_mm_rows_of_a_far_apart(far):
    qa, sa = fp8.quantize(randn(3, 32), dim=1)
    qb, sb = fp8.quantize(randn(16, 32, seed=1), dim=1)
    a = far(qa, (HALF_FAR, 1))
    got = run(lambda: mps_ext.scaled_mm(a, qb.t(), sa, sb.view(1, -1), out_dtype=torch.float32),
              "scaled_mm_gemv_m4_fp8_float")
    want = torch._scaled_mm(a.contiguous(), qb.t(), sa, sb.view(1, -1), out_dtype=torch.float32)
    assert_close(got, want)


def test_grouped_mm_rows_and_experts_far_apart(far):
    # MoE decode: routed rows far apart, and experts (G, N, K) 2^32 elements apart.
    a = far(randn(3, 32, dtype=torch.bfloat16), (HALF_FAR, 1))
    experts = far(randn(2, 24, 32, dtype=torch.bfloat16, seed=1), (FAR, 32, 1))
    offs = torch.tensor([1, 3], dtype=torch.int32)
    got = run(lambda: mps_ext.grouped_mm(a, experts.transpose(1, 2), offs), "grouped_mm_decode_m2_bfloat")
    want = torch._grouped_mm(a.contiguous(), experts.contiguous().transpose(1, 2), offs)
    assert_close(got, want)


def test_fp8_grouped_mm_experts_far_apart(far):
    q, scale = fp8.quantize(randn(2, 24, 64, seed=1), dim=2)
    experts = far(q, (FAR, 64, 1))
    x = randn(3, 64, dtype=torch.bfloat16)
    offs = torch.tensor([2, 3], dtype=torch.int32)
    with mps_ext.sim.checked(), mps_ext.trace() as t:
        got = mps_ext.fp8_grouped_mm(x, experts, scale, offs)
    assert t.names and all(n.startswith("fp8_grouped_mm_") for n in t.names), t.names
    w = fp8.dequantize(experts.contiguous(), scale)
    want = torch.cat([x[:2].float() @ w[0].t(), x[2:].float() @ w[1].t()])
    assert_close(got, want.bfloat16())


# Square matrices with rows (or columns) far apart and batch-expanded: order 3 runs the one-thread kernels,
# order 5 the SIMD-group ones; (i, j) lies i * rows + j * cols elements into the storage.
ORDERS = {3: (2**31 + 1, 1), 5: (1, 2**30 + 1)}


def matrix(far, make, n):
    return far(make(1, n)[0], ORDERS[n]).expand(2, n, n)


@pytest.mark.parametrize("n", ORDERS)
def test_lu_factor_and_solve_far_apart(far, n):
    A = matrix(far, well_conditioned, n)
    B = randn(2, n, 2)
    kind = "thread" if n <= 4 else "simd"
    LU, pivots, info = run(lambda: mps_ext.lu_factor_ex(A), f"lu_factor_{kind}_float")
    want_LU, want_pivots, _ = torch.linalg.lu_factor_ex(A.contiguous())
    assert_close(LU, want_LU)
    assert torch.equal(pivots, want_pivots) and not info.any()
    X = run(lambda: mps_ext.solve(A, B), *(["lu_solve_fused_thread_float"] if n <= 4 else
                                          ["lu_factor_simd_float", "lu_solve_simd_float"]))
    assert_close(X, torch.linalg.solve(A.contiguous(), B))


@pytest.mark.parametrize("n", ORDERS)
def test_inverse_far_apart(far, n):
    A = matrix(far, well_conditioned, n)
    got = run(lambda: mps_ext.inv(A), f"lu_inverse_{'thread' if n <= 4 else 'simd'}_float")
    assert_close(got, torch.linalg.inv(A.contiguous()))


@pytest.mark.parametrize("n", ORDERS)
def test_solve_triangular_far_apart(far, n):
    A = matrix(far, triangular, n)
    B = randn(2, n, 3)
    with mps_ext.sim.checked(), mps_ext.trace() as t:
        got = mps_ext.solve_triangular(A, B, upper=True)
    assert t.names and all(k.startswith("trsm_") for k in t.names), t.names
    assert_close(got, torch.linalg.solve_triangular(A.contiguous(), B, upper=True))


def test_qr_far_apart(far):
    A = far(randn(6, 4), (-(-2**32 // 5), 1))
    Q, R = run(lambda: mps_ext.qr(A), "qr_geqrf_simd_float", "qr_householder_simd_float")
    want_Q, want_R = torch.linalg.qr(A.contiguous())
    assert_close(Q, want_Q)
    assert_close(R, want_R)
