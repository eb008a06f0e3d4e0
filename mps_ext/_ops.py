"""The Python API of mps_ext's ops, with torch's semantics and autograd."""

from __future__ import annotations

import operator

import torch

from . import _C  # registers the mps_ext:: operators
from . import _autograd

# Python types torch accepts where it wants a dtype.
_PYTHON_DTYPES = {float: torch.float64, int: torch.int64, bool: torch.bool, complex: torch.complex128}


def _check_args(op: str, input, dim, dtype) -> tuple[int, torch.dtype | None]:
    """The argument errors torch's own op gives (TypeError, naming the argument), before the dispatcher's."""
    if not isinstance(input, torch.Tensor):
        raise TypeError(f"{op}(): argument 'input' (position 1) must be Tensor, not {type(input).__name__}")
    if isinstance(dim, bool):
        raise TypeError(f"{op}(): argument 'dim' (position 2) must be int, not bool")
    try:
        dim = operator.index(dim)
    except TypeError:
        raise TypeError(f"{op}(): argument 'dim' (position 2) must be int, not {type(dim).__name__}") from None
    if dtype is not None and not isinstance(dtype, torch.dtype):
        if dtype not in _PYTHON_DTYPES:
            raise TypeError(f"{op}(): argument 'dtype' must be torch.dtype, not {type(dtype).__name__}")
        dtype = _PYTHON_DTYPES[dtype]
    return dim, dtype


def softmax(input: torch.Tensor, dim: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Softmax over ``dim``, as ``torch.softmax(input, dim, dtype=dtype)``.

    Runs mps_ext's kernels for float32, float16 and bfloat16 (a float16 or
    bfloat16 input with ``dtype=torch.float32`` is converted inside the
    kernel); on ``mps`` tensors on the GPU, on CPU tensors in the simulator.
    Other cases go to torch. Differentiable.
    """
    dim, dtype = _check_args("softmax", input, dim, dtype)
    return torch.ops.mps_ext.softmax(input, dim, dtype)


def log_softmax(input: torch.Tensor, dim: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Log-softmax over ``dim``, as ``torch.log_softmax(input, dim, dtype=dtype)``; see :func:`softmax`."""
    dim, dtype = _check_args("log_softmax", input, dim, dtype)
    return torch.ops.mps_ext.log_softmax(input, dim, dtype)


def _setup(ctx, inputs, kwargs, output):
    input, dim, _ = inputs
    ctx.dim, ctx.input_dtype = dim, input.dtype
    ctx.save_for_backward(output)


def _softmax_backward(ctx, grad):
    (out,) = ctx.saved_tensors
    return torch._softmax_backward_data(grad, out, ctx.dim, out.dtype).to(ctx.input_dtype), None, None


def _log_softmax_backward(ctx, grad):
    (out,) = ctx.saved_tensors
    return torch._log_softmax_backward_data(grad, out, ctx.dim, out.dtype).to(ctx.input_dtype), None, None


def _softmax_jvp(inputs, kwargs, out, tangents):
    t = tangents[0].to(out.dtype)
    return out * (t - (out * t).sum(inputs[1], keepdim=True))


def _log_softmax_jvp(inputs, kwargs, out, tangents):
    t = tangents[0].to(out.dtype)
    return t - (out.exp() * t).sum(inputs[1], keepdim=True)


_autograd.register("softmax", _setup, _softmax_backward, _softmax_jvp)
_autograd.register("log_softmax", _setup, _log_softmax_backward, _log_softmax_jvp)


def linear(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``input @ weight.T + bias``, as ``torch.nn.functional.linear(input, weight, bias)``.

    Runs mps_ext's GEMV kernels when the leading dimensions of ``input`` hold
    1 to 8 rows (decode), for float32, float16 and bfloat16, with ``weight``
    (out_features, in_features) row-major or column-major (``W.t()`` of an
    (in_features, out_features) matrix, as transformers' ``Conv1D`` holds it;
    any stride between rows) and ``bias`` None or 1-D: one pass over the
    weights for all rows, float accumulation, the bias
    added before the one rounding. On ``mps`` tensors on the GPU, on CPU
    tensors in the simulator; everything else goes to torch. Mismatched
    dtypes, devices or sizes raise ``RuntimeError`` naming the argument.
    Differentiable.
    """
    return torch.ops.mps_ext.linear(input, weight, bias)


@torch.library.register_fake("mps_ext::linear")
def _linear_fake(input, weight, bias=None):
    return torch.nn.functional.linear(input, weight, bias)


def _linear_setup(ctx, inputs, kwargs, output):
    input, weight, bias = inputs
    ctx.bias_shape = None if bias is None else bias.shape
    ctx.save_for_backward(input, weight)


def _linear_backward(ctx, grad):
    input, weight = ctx.saved_tensors
    grad_input = grad_weight = grad_bias = None
    if ctx.needs_input_grad[0]:
        grad_input = grad.unsqueeze(-1) * weight if weight.dim() == 1 else grad @ weight
    if ctx.needs_input_grad[1]:
        if weight.dim() == 1:
            grad_weight = (grad.unsqueeze(-1) * input).reshape(-1, weight.shape[0]).sum(0)
        else:
            grad_weight = grad.reshape(-1, weight.shape[0]).t() @ input.reshape(-1, weight.shape[1])
    if ctx.needs_input_grad[2]:
        grad_bias = grad.sum_to_size(ctx.bias_shape)
    return grad_input, grad_weight, grad_bias


def _linear_jvp(inputs, kwargs, out, tangents):
    (input, weight, _), (t_input, t_weight, t_bias) = inputs, tangents
    return _autograd.tangent_sum([None if t_input is None else linear(t_input, weight),
                        None if t_weight is None else linear(input, t_weight), t_bias], out)


_autograd.register("linear", _linear_setup, _linear_backward, _linear_jvp)
# Small-matrix linear algebra (torch.linalg semantics). Backward recomputes the
# forward with torch's differentiable op and differentiates through torch's
# formulas (with the overrides enabled, that recomputation runs the kernels too).


def lu_factor_ex(A: torch.Tensor, *, pivot: bool = True, check_errors: bool = False):
    """LU factorization with partial pivoting, as ``torch.linalg.lu_factor_ex``.

    Returns ``(LU, pivots, info)``: ``LU`` holds L (unit diagonal, below) and U,
    ``pivots`` are LAPACK's 1-based int32 row interchanges (the same rows torch
    picks on the CPU: the first of the largest |a|, |re| + |im| for complex),
    ``info`` is 0, or k > 0 when U[k-1, k-1] is exactly zero. Runs mps_ext's
    kernels for float32 and complex64 square matrices of order <= 64 (batches
    broadcast as in torch); other inputs, and ``pivot=False``, go to torch.
    """
    return torch.ops.mps_ext.lu_factor_ex(A, pivot=pivot, check_errors=check_errors)


def lu_factor(A: torch.Tensor, *, pivot: bool = True):
    """``(LU, pivots)`` as ``torch.linalg.lu_factor``; raises for singular matrices. See :func:`lu_factor_ex`."""
    LU, pivots, info = lu_factor_ex(A, pivot=pivot)
    _C._before_torch_ops(A.device.type)  # info is read here, on the host
    torch._linalg_check_errors(info, "torch.linalg.lu_factor", is_matrix=A.dim() == 2)
    return LU, pivots


def lu_solve(LU: torch.Tensor, pivots: torch.Tensor, B: torch.Tensor, *, left: bool = True, adjoint: bool = False):
    """Solves ``A X = B`` (``X A = B`` when ``left=False``; ``A^H`` when ``adjoint``) from
    ``lu_factor(A)``, as ``torch.linalg.lu_solve``. float32 and complex64, order <= 64."""
    return torch.ops.mps_ext.lu_solve(LU, pivots, B, left=left, adjoint=adjoint)


def solve_ex(A: torch.Tensor, B: torch.Tensor, *, left: bool = True, check_errors: bool = False):
    """``(result, info)`` as ``torch.linalg.solve_ex``. See :func:`solve`."""
    result, _, _, info = torch.ops.mps_ext.solve_ex(A, B, left=left, check_errors=check_errors)
    return result, info


def solve(A: torch.Tensor, B: torch.Tensor, *, left: bool = True):
    """Solves ``A X = B`` (``X A = B`` when ``left=False``) as ``torch.linalg.solve``: B may be
    a (batch of) vector(s); batches broadcast; a singular A raises ``torch.linalg.LinAlgError``.

    float32 and complex64 of order <= 64 run mps_ext's kernels: up to order 4
    one thread factors and solves each system in a single dispatch; larger
    orders factor (one SIMD group per matrix) and then solve (one SIMD group per
    right-hand side). Other inputs go to torch.
    """
    result, _, _, info = torch.ops.mps_ext.solve_ex(A, B, left=left)
    _C._before_torch_ops(A.device.type)  # info is read here, on the host
    torch._linalg_check_errors(info, "torch.linalg.solve", is_matrix=A.dim() == 2)
    return result


def inv_ex(A: torch.Tensor, *, check_errors: bool = False):
    """``(inverse, info)`` as ``torch.linalg.inv_ex``: ``info`` is the LU factorization's (0, or k > 0
    when U[k-1, k-1] is exactly zero, the inverse then holding infs and NaNs). See :func:`inv`."""
    return torch.ops.mps_ext.inv_ex(A, check_errors=check_errors)


def inv(A: torch.Tensor):
    """The inverse of a (batch of) square matrices, as ``torch.linalg.inv``; a singular A raises
    ``torch.linalg.LinAlgError``.

    float32 and complex64 of order <= 64 run mps_ext's kernels, one dispatch:
    up to order 4 one thread factors and inverts each matrix; larger orders one
    SIMD group, which factors the matrix in threadgroup memory and solves
    ``A X = I`` from the factors there. Other inputs go to torch.
    """
    inverse, info = torch.ops.mps_ext.inv_ex(A)
    _C._before_torch_ops(A.device.type)  # info is read here, on the host
    torch._linalg_check_errors(info, "linalg.inv", is_matrix=A.dim() == 2)
    return inverse


def qr(A: torch.Tensor, mode: str = "reduced"):
    """``(Q, R)`` with ``A = Q R`` as ``torch.linalg.qr``: ``mode`` "reduced" (Q m x k, R k x n, k = min(m, n)),
    "complete" (Q m x m, R m x n) or "r" (R only, Q empty).

    float32 and complex64 matrices of at most 64 rows and columns run mps_ext's kernels: Householder
    reflections with LAPACK's conventions (geqrf, then orgqr for Q), one SIMD group per matrix in threadgroup
    memory, so Q and R are torch's on the CPU, signs included (R's diagonal is negative where A's column
    leads with a positive entry). Other inputs go to torch.
    """
    return torch.ops.mps_ext.qr(A, mode)


def householder_product(A: torch.Tensor, tau: torch.Tensor):
    """The first n columns of ``H_0 ... H_{k-1}``, ``H_i = I - tau_i v_i v_i^H`` with ``v_i`` below the
    diagonal of column i of A (unit leading entry), as ``torch.linalg.householder_product`` (LAPACK's
    orgqr/ungqr). float32 and complex64, m, n <= 64; other inputs go to torch."""
    return torch.ops.mps_ext.householder_product(A, tau)


def solve_triangular(A: torch.Tensor, B: torch.Tensor, *, upper: bool, left: bool = True,
                     unitriangular: bool = False):
    """Solves ``A X = B`` (``X A = B`` when ``left=False``) for a triangular A, as
    ``torch.linalg.solve_triangular`` (only the ``upper`` or lower triangle is read;
    ``unitriangular`` takes its diagonal as ones).

    float32 and complex64 of order <= 64 run mps_ext's kernels; float32 triangles
    of order 16, 32 or 64 with at least 8 right-hand sides are inverted once per
    system and the inverse applied to every column. Other inputs go to torch.
    """
    return torch.ops.mps_ext.solve_triangular(A, B, upper=upper, left=left, unitriangular=unitriangular)


def _differentiable(inputs, grads, torch_op):
    """Gradients of ``outputs = torch_op(*inputs)`` through torch's own derivative formulas (a vjp, so that
    it also runs inside torch.func's transforms: grad, jacrev, vmap of either)."""
    tensors = [x for x in inputs if isinstance(x, torch.Tensor)]
    wrt = [i for i, x in enumerate(tensors) if x.is_floating_point() or x.is_complex()]

    cotangents = []

    def outputs(*diff):
        args = list(tensors)
        for i, d in zip(wrt, diff):
            args[i] = d
        outs = torch_op(*args)
        outs = outs if isinstance(outs, (tuple, list)) else (outs,)
        pairs = [(o, g) for o, g in zip(outs, grads) if g is not None and (o.is_floating_point() or o.is_complex())]
        cotangents[:] = [g for _, g in pairs]
        return tuple(o for o, _ in pairs)

    with torch.enable_grad():
        _, vjp = torch.func.vjp(outputs, *[tensors[i] for i in wrt])
        got = iter(vjp(tuple(cotangents)))
    return tuple(next(got) if i in wrt else None for i in range(len(tensors)))


def _save_inputs(ctx, inputs, kwargs, output):
    ctx.save_for_backward(*inputs)
    ctx.flags = kwargs


def _lu_factor_ex_backward(ctx, grad_LU, grad_pivots, grad_info):
    (A,) = ctx.saved_tensors
    pivot = ctx.flags["pivot"]
    return (_differentiable([A], [grad_LU], lambda a: torch.linalg.lu_factor_ex(a, pivot=pivot)[:1])[0],)


def _lu_solve_backward(ctx, grad):
    LU, pivots, B = ctx.saved_tensors
    gLU, _, gB = _differentiable([LU, pivots, B], [grad], lambda lu, p, b: torch.linalg.lu_solve(lu, p, b, **ctx.flags))
    return gLU, None, gB


def _solve_ex_backward(ctx, grad_result, grad_LU, grad_pivots, grad_info):
    A, B = ctx.saved_tensors
    left = ctx.flags["left"]
    return _differentiable([A, B], [grad_result], lambda a, b: torch.ops.aten._linalg_solve_ex(a, b, left=left)[0])


def _inv_ex_backward(ctx, grad_inverse, grad_info):
    (A,) = ctx.saved_tensors
    return _differentiable([A], [grad_inverse], lambda a: torch.linalg.inv_ex(a)[:1])[0]


def _qr_setup(ctx, inputs, kwargs, output):
    A, ctx.mode = inputs  # the mode is positional, as in torch.linalg.qr
    ctx.save_for_backward(A)


def _qr_backward(ctx, grad_Q, grad_R):
    (A,) = ctx.saved_tensors
    return _differentiable([A], [grad_Q, grad_R], lambda a: torch.linalg.qr(a, ctx.mode))[0], None


def _householder_product_backward(ctx, grad):
    return _differentiable(ctx.saved_tensors, [grad], torch.linalg.householder_product)


def _solve_triangular_backward(ctx, grad):
    A, B = ctx.saved_tensors
    return _differentiable([A, B], [grad], lambda a, b: torch.linalg.solve_triangular(a, b, **ctx.flags))


# Forward derivatives (torch's formulas), computed with the ops themselves.


def _lu_tangent(LU, pivots, t_A):
    """The tangent of the packed LU factors of a square A = P L U: with
    M = L^-1 P^T dA U^-1, dL = L tril(M, -1) and dU = triu(M) U."""
    if t_A is None:
        return torch.zeros_like(LU)
    P, L, U = torch.lu_unpack(LU, pivots)
    M = solve_triangular(L, P.mT @ t_A, upper=False, unitriangular=True)
    M = solve_triangular(U, M, upper=True, left=False)
    return L @ M.tril(-1) + M.triu() @ U


def _lu_factor_ex_jvp(inputs, kwargs, outputs, tangents):
    (A,), (LU, pivots, _) = inputs, outputs
    if A.shape[-1] != A.shape[-2]:
        raise NotImplementedError("mps_ext.lu_factor_ex: forward-mode derivative for square matrices only")
    return _lu_tangent(LU, pivots, tangents[0]), None, None


def _residual(t_rhs, t_A, X, left):
    """``dB - dA X`` (``dB - X dA`` when not ``left``): what the solution's tangent solves for."""
    product = None if t_A is None else (t_A @ X if left else X @ t_A)
    if product is None:
        return t_rhs
    return -product if t_rhs is None else t_rhs - product


def _lu_solve_jvp(inputs, kwargs, X, tangents):
    (LU, pivots, _), (t_LU, _, t_B) = inputs, tangents
    t_A = None
    if t_LU is not None:
        P, L, U = torch.lu_unpack(LU, pivots)
        t_A = P @ (t_LU.tril(-1) @ U + L @ t_LU.triu())
        t_A = t_A.mH if kwargs["adjoint"] else t_A
    return lu_solve(LU, pivots, _residual(t_B, t_A, X, kwargs["left"]), **kwargs)


def _solve_ex_jvp(inputs, kwargs, outputs, tangents):
    (A, B), (X, LU, pivots, _), (t_A, t_B) = inputs, outputs, tangents
    left = kwargs["left"]
    vector = B.dim() == 1 or (B.dim() == A.dim() - 1 and B.shape == A.shape[:-1])
    X_ = X.unsqueeze(-1) if vector else X
    t_B = t_B.unsqueeze(-1) if vector and t_B is not None else t_B
    t_X = lu_solve(LU, pivots, _residual(t_B, t_A, X_, left), left=left)
    return t_X.squeeze(-1) if vector else t_X, _lu_tangent(LU, pivots, t_A), None, None


def _inv_ex_jvp(inputs, kwargs, outputs, tangents):
    (t_A,), (X, _) = tangents, outputs
    return -X @ t_A @ X, None


def _qr_jvp(inputs, kwargs, outputs, tangents):
    """torch's linalg_qr_jvp: with C = Q^H dA R^-1 (= Q^H dQ + dR R^-1, skew-Hermitian plus upper triangular),
    dR R^-1 is the upper part of C + C^H with its real diagonal halved. Wide A: the square part first."""
    (A, mode), (Q, R), (t_A, _) = inputs, outputs, tangents
    m, n = A.shape[-2:]
    if mode == "r" or (mode == "complete" and m > n):
        raise NotImplementedError(f"mps_ext.qr: no forward-mode derivative for mode={mode!r} with m > n (nor in torch)")
    k = min(m, n)
    t_X = t_A[..., :k]
    t_X_Rinv = solve_triangular(R[..., :k], t_X, upper=True, left=False)
    C = Q.mH @ t_X_Rinv
    S = (C + C.mH).triu()
    S = S - 0.5 * torch.diag_embed(S.diagonal(dim1=-2, dim2=-1))
    t_Q = t_X_Rinv - Q @ S
    t_R = S @ R
    if n > m:  # R's right part: Q^H (dY - dQ R_2)
        t_R = torch.cat([t_R[..., :k], Q.mH @ (t_A[..., k:] - t_Q @ R[..., k:])], dim=-1)
    return t_Q, t_R


def _householder_product_jvp(inputs, kwargs, Q, tangents):
    """The product rule over Q = H_0 ... H_{k-1} (first n columns), H_i = I - tau_i v_i v_i^H:
    dQ = sum_i H_0 ... H_{i-1} dH_i H_{i+1} ... H_{k-1}."""
    (A, tau), (t_A, t_tau) = inputs, tangents
    m, n, k = A.shape[-2], A.shape[-1], tau.shape[-1]
    eye = torch.eye(m, dtype=A.dtype, device=A.device)
    V = A.tril(-1)[..., :k] + eye[:, :k]
    t_V = torch.zeros_like(V) if t_A is None else t_A.tril(-1)[..., :k]
    t_tau = torch.zeros_like(tau) if t_tau is None else t_tau
    v = [V[..., i:i + 1] for i in range(k)]
    t_v = [t_V[..., i:i + 1] for i in range(k)]
    t = [tau[..., i, None, None] for i in range(k)]
    H = [eye - t[i] * v[i] @ v[i].mH for i in range(k)]
    after = [eye[:, :n]]  # H_{i+1} ... H_{k-1}, first n columns, from i = k - 1 down
    for i in reversed(range(1, k)):
        after.append(H[i] @ after[-1])
    after.reverse()
    t_Q, before = torch.zeros_like(Q), eye
    for i in range(k):
        t_H = -(t_tau[..., i, None, None] * v[i] @ v[i].mH + t[i] * (t_v[i] @ v[i].mH + v[i] @ t_v[i].mH))
        t_Q = t_Q + before @ t_H @ after[i]
        before = before @ H[i]
    return t_Q


def _solve_triangular_jvp(inputs, kwargs, X, tangents):
    (A, _), (t_A, t_B) = inputs, tangents
    if t_A is not None:  # only the triangle read is A
        t_A = t_A.triu(int(kwargs["unitriangular"])) if kwargs["upper"] else t_A.tril(-int(kwargs["unitriangular"]))
    return solve_triangular(A, _residual(t_B, t_A, X, kwargs["left"]), **kwargs)


_autograd.register("lu_factor_ex", _save_inputs, _lu_factor_ex_backward, _lu_factor_ex_jvp)
_autograd.register("lu_solve", _save_inputs, _lu_solve_backward, _lu_solve_jvp)
_autograd.register("solve_ex", _save_inputs, _solve_ex_backward, _solve_ex_jvp)
_autograd.register("inv_ex", _save_inputs, _inv_ex_backward, _inv_ex_jvp)
_autograd.register("qr", _qr_setup, _qr_backward, _qr_jvp)
_autograd.register("householder_product", _save_inputs, _householder_product_backward, _householder_product_jvp)
_autograd.register("solve_triangular", _save_inputs, _solve_triangular_backward, _solve_triangular_jvp)


# Fake (meta) kernels: the shapes and layouts the kernels produce (torch's:
# column-major factors and left solutions; right solutions row-major).


def _solution(B, batch, n, k, left):
    out = B.new_empty(*batch, k, n)
    return out.mT if left else out


@torch.library.register_fake("mps_ext::lu_factor_ex")
def _lu_factor_ex_fake(A, *, pivot=True, check_errors=False):
    *batch, m, n = A.shape
    return (A.new_empty(*batch, n, m).mT, A.new_empty(*batch, min(m, n), dtype=torch.int32),
            A.new_empty(batch, dtype=torch.int32))


@torch.library.register_fake("mps_ext::lu_solve")
def _lu_solve_fake(LU, pivots, B, *, left=True, adjoint=False):
    batch = torch.broadcast_shapes(LU.shape[:-2], B.shape[:-2])
    return _solution(B, batch, LU.shape[-1], B.shape[-1] if left else B.shape[-2], left)


@torch.library.register_fake("mps_ext::solve_ex")
def _solve_ex_fake(A, B, *, left=True, check_errors=False):
    vector = B.dim() == 1 or (B.dim() == A.dim() - 1 and B.shape == A.shape[:-1])
    B_ = B.unsqueeze(-1) if vector else B
    batch = torch.broadcast_shapes(A.shape[:-2], B_.shape[:-2])
    X = _solution(B, batch, A.shape[-1], B_.shape[-1] if left else B_.shape[-2], left)
    LU, pivots, info = _lu_factor_ex_fake(A)
    return X.squeeze(-1) if vector else X, LU, pivots, info


@torch.library.register_fake("mps_ext::inv_ex")
def _inv_ex_fake(A, *, check_errors=False):
    return A.new_empty(A.shape).mT, A.new_empty(A.shape[:-2], dtype=torch.int32)


@torch.library.register_fake("mps_ext::qr")
def _qr_fake(A, mode="reduced"):
    *batch, m, n = A.shape
    k = min(m, n)
    rows = m if mode == "complete" else k  # Q's columns and R's rows
    Q = A.new_empty(0) if mode == "r" else A.new_empty(*batch, rows, m).mT
    return Q, A.new_empty(*batch, n, rows).mT


@torch.library.register_fake("mps_ext::householder_product")
def _householder_product_fake(A, tau):
    *batch, m, n = A.shape
    return A.new_empty(*batch, n, m).mT


@torch.library.register_fake("mps_ext::solve_triangular")
def _solve_triangular_fake(A, B, *, upper, left=True, unitriangular=False):
    batch = torch.broadcast_shapes(A.shape[:-2], B.shape[:-2])
    return _solution(B, batch, A.shape[-1], B.shape[-1] if left else B.shape[-2], left)
def _fake(op, input, dim, dtype):
    # torch's meta kernel does not check dim; its CPU kernel raises this.
    ndim = max(input.dim(), 1)
    if not -ndim <= dim < ndim:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-ndim}, {ndim - 1}], but got {dim})")
    return op(input, dim, dtype=dtype)


# Shapes, dtypes and argument checks without running anything (meta tensors, torch.compile, export):
# torch's own op on the fake input.
@torch.library.register_fake("mps_ext::softmax")
def _softmax_fake(input, dim, dtype=None):
    return _fake(torch.softmax, input, dim, dtype)


@torch.library.register_fake("mps_ext::log_softmax")
def _log_softmax_fake(input, dim, dtype=None):
    return _fake(torch.log_softmax, input, dim, dtype)


def grouped_mm(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor | None = None,
               out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Grouped matrix product, as ``torch._grouped_mm(a, b, offs=offs, out_dtype=out_dtype)``.

    ``offs`` (int32, cumulative ends) splits the rows of ``a`` for 2-D ``a`` and
    3-D ``b`` (one matrix of ``b`` per group: Mixture-of-Experts), the columns
    of ``b`` for 3-D ``a`` and 2-D ``b``, K for two 2-D operands (output
    ``(G, M, N)``); two 3-D operands are a batched product without ``offs``.
    Positions past ``offs[-1]`` are left unwritten, as torch leaves them.
    Runs mps_ext's kernels for float32, float16 and bfloat16 with ``offs``
    read on the device (one dispatch, no synchronisation); ``b`` as the
    transposed expert weights (``experts.transpose(-2, -1)``) takes the
    decode kernel when groups are small. Unlike torch, any strides and
    alignments are accepted. Invalid arguments raise torch's
    ``RuntimeError`` naming the argument. Differentiable.
    """
    return torch.ops.mps_ext.grouped_mm(a, b, offs, out_dtype)


def _grouped_mm_layout(a, b, offs):
    """torch's output sizes and strides: the last dimension padded to 16 bytes."""
    if a.dim() == 2 and b.dim() == 2:
        size = [offs.shape[0], a.shape[0], b.shape[1]]
    elif a.dim() == 2:
        size = [a.shape[0], b.shape[-1]]
    elif b.dim() == 2:
        size = [a.shape[1], b.shape[1]]
    else:
        size = [a.shape[0], a.shape[1], b.shape[-1]]
    align = 16 // a.element_size()
    padded = (size[-1] + align - 1) // align * align
    stride = [padded, 1] if len(size) == 2 else [size[1] * padded, padded, 1]
    return size, stride


@torch.library.register_fake("mps_ext::grouped_mm")
def _grouped_mm_fake(a, b, offs=None, out_dtype=None):
    torch._check(a.dim() in (2, 3) and b.dim() in (2, 3), lambda: "a and b have to be 2 or 3d")
    torch._check((offs is not None) == (a.dim() == 2 or b.dim() == 2),
                 lambda: "Have to provide offsets (offs) if there is a 2d matrix, or no offset if both are 3d")
    torch._check(out_dtype is None or out_dtype == a.dtype, lambda: "out_dtype must match a's dtype")
    size, stride = _grouped_mm_layout(a, b, offs)
    return torch.empty_strided(size, stride, dtype=a.dtype, device=a.device)


def _grouped_mm_setup(ctx, inputs, kwargs, output):
    a, b, offs, _ = inputs
    ctx.save_for_backward(a, b, offs)


def _zero_past(t, offs, dim):
    """``t`` with the positions at or past ``offs[-1]`` along ``dim`` set to 0 (on the device)."""
    if offs.numel() == 0:
        return torch.zeros_like(t)
    shape = [1] * t.dim()
    shape[dim] = t.shape[dim]
    keep = torch.arange(t.shape[dim], device=t.device).view(shape) < offs[-1:].view([1] * t.dim())
    return torch.where(keep, t, torch.zeros((), dtype=t.dtype, device=t.device))


def _grouped_mm_backward(ctx, grad):
    a, b, offs = ctx.saved_tensors
    grad_a = grad_b = None
    gm = torch.ops.mps_ext.grouped_mm
    if a.dim() == 2 and b.dim() == 3:  # rows of a split
        grad = _zero_past(grad, offs, 0)
        if ctx.needs_input_grad[0]:
            grad_a = _zero_past(gm(grad, b.transpose(-2, -1), offs, None), offs, 0)
        if ctx.needs_input_grad[1]:
            grad_b = gm(a.t(), grad, offs, None)
    elif a.dim() == 3 and b.dim() == 2:  # columns of b split
        grad = _zero_past(grad, offs, 1)
        if ctx.needs_input_grad[0]:
            grad_a = gm(grad, b.t(), offs, None)
        if ctx.needs_input_grad[1]:
            grad_b = _zero_past(gm(a.transpose(-2, -1), grad, offs, None), offs, 1)
    elif a.dim() == 2:  # K split
        if ctx.needs_input_grad[0]:
            grad_a = _zero_past(gm(grad, b.t(), offs, None), offs, 1)
        if ctx.needs_input_grad[1]:
            grad_b = _zero_past(gm(a.t(), grad, offs, None), offs, 0)
    else:
        if ctx.needs_input_grad[0]:
            grad_a = gm(grad, b.transpose(-2, -1), None, None)
        if ctx.needs_input_grad[1]:
            grad_b = gm(a.transpose(-2, -1), grad, None, None)
    return grad_a, grad_b, None, None


def _grouped_mm_jvp(inputs, kwargs, out, tangents):
    (a, b, offs, out_dtype), (t_a, t_b) = inputs, tangents[:2]
    gm = torch.ops.mps_ext.grouped_mm
    t = _autograd.tangent_sum([None if t_a is None else gm(t_a, b, offs, out_dtype),
                     None if t_b is None else gm(a, t_b, offs, out_dtype)], out)
    if offs is not None and a.dim() != b.dim():  # rows (columns) past offs[-1] are not written
        t = _zero_past(t, offs, 0 if a.dim() == 2 else 1)
    return t


_autograd.register("grouped_mm", _grouped_mm_setup, _grouped_mm_backward, _grouped_mm_jvp)


def scaled_dot_product_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                 attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False, *,
                                 sinks: torch.Tensor | None = None, window: int | None = None,
                                 softcap: float | None = None) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` with three more arguments, on mps_ext's attention kernels.

    ``sinks``: one logit per query head (1-D, any float dtype), gpt-oss's attention sinks: a key that every
    row attends with that logit and a value of 0, so the weights of the real keys sum to less than 1.
    ``window``: a sliding window of that many keys: query row ``i`` attends the keys ending at its position
    ``key_len - query_len + i`` (aligned to the end of the keys, as with a KV cache: the last row is the
    last key), the kernels skipping the others instead of reading a mask. ``softcap``: Gemma-2's logit
    softcapping, each scaled score ``s`` becoming ``softcap * tanh(s / softcap)`` before the mask is added
    (its derivative in the backward kernels too). All combine with ``attn_mask``, ``is_causal`` (torch's top-left
    alignment) and GQA. Decode (up to 8 query rows) and prefill kernels for
    float32, float16 and bfloat16 and head dims up to 256; on ``mps`` tensors on the GPU, on CPU tensors in
    the simulator. Other cases, dropout and calls that need a derivative run torch's math for the same
    definition (counted in ``mps_ext.overrides.stats()``). Bad arguments raise ``RuntimeError`` naming them.
    """
    return torch.ops.mps_ext.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal,
                                                          scale, enable_gqa, sinks=sinks, window=window or 0,
                                                          softcap=softcap or 0.0)


@torch.library.register_fake("mps_ext::scaled_dot_product_attention")
def _attention_fake(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                    enable_gqa=False, *, sinks=None, window=0, softcap=0.0):
    return torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask, 0.0, is_causal,
                                                            scale=scale, enable_gqa=enable_gqa)


@torch.library.register_fake("mps_ext::_scaled_dot_product_attention_training")
def _attention_training_fake(query, key, value, attn_mask, is_causal, scale, enable_gqa, sinks, window, softcap):
    out = _attention_fake(query, key, value, attn_mask, 0.0, is_causal, scale, enable_gqa)
    return out, out.new_empty((out.numel() // max(out.size(-1), 1), 2), dtype=torch.float32)


@torch.library.register_fake("mps_ext::_scaled_dot_product_attention_training_backward")
def _attention_training_backward_fake(grad_out, query, key, value, out, stats, attn_mask, is_causal, scale,
                                      enable_gqa, sinks, window, softcap):
    return (torch.empty_like(query), torch.empty_like(key), torch.empty_like(value),
            None if sinks is None else torch.empty_like(sinks))
