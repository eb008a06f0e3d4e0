"""The host side of each op, as csrc/ops/*.cpp computes it: kernel choice
(host names built like csrc/ops/naming.h), launch geometry and parameter
structs (field order of metal/include/mps_ext/params.h). Each function returns
(launches, outputs); nothing runs until the launcher runs the launches.
Keep in step with csrc/ops when those change (the constants are named alike).
"""

from __future__ import annotations

import torch

from cuda import Launch, u32s

METAL_TYPE = {torch.float32: "float", torch.float16: "half", torch.bfloat16: "bfloat", torch.complex64: "float2",
              torch.float8_e4m3fn: "fp8", torch.uint8: "fp8"}


def fill_simdgroups(kernel: str, threads: int) -> int:
    """Backend::fill_simdgroups: how many SIMD groups fill the GPU for `kernel` at `threads` per threadgroup.
    The simulator's value (32 cores x 32) until run.py sets the GPU's: SMs x the warps of the kernel one SM
    keeps resident."""
    return 32 * 32


def host_name(op: str, kernel: str, *types) -> str:
    return "_".join([op, kernel, *(METAL_TYPE[t] for t in types)])


def ceil_div(a: int, b: int) -> int:
    return (a + b - 1) // b


def aligned16(t: torch.Tensor) -> bool:
    return t.data_ptr() % 16 == 0


def byte_view(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == torch.uint8 else t.view(torch.uint8)


# ---------------------------------------------------------------- softmax (csrc/ops/softmax.cpp)

K_SIMD_COLS, K_BLOCK_COLS, K_SOFTMAX_SG = 128, 4096, 8
K_SPLIT_THREADS = 256
K_CHUNK = K_SPLIT_THREADS * 8
K_STRIDED_THREADS = 256


def softmax(x: torch.Tensor, dim: int, log: bool, out_dtype=None):
    """x contiguous; dim the last one, or a middle one with enough columns for the strided kernel."""
    out_dtype = out_dtype or x.dtype
    dim = dim % x.dim()
    cols = x.shape[dim]
    inner = 1
    for s in x.shape[dim + 1:]:
        inner *= s
    outer = x.numel() // (cols * inner)
    assert inner == 1 or outer * inner >= 1024, "small strided cases move the dim last (not mirrored here)"
    op = "log_softmax" if log else "softmax"
    y = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    es = x.element_size()
    vectorized = int(inner == 1 and cols % 4 == 0 and x.data_ptr() % (4 * es) == 0)
    if inner != 1:
        rows = outer * inner
        p = u32s(rows, cols, inner, 0, 0, vectorized)
        return [Launch(host_name(op, "strided", x.dtype, out_dtype), (ceil_div(rows, K_STRIDED_THREADS),),
                       (K_STRIDED_THREADS,), [x, y, p])], y
    rows = x.numel() // cols
    if cols <= K_SIMD_COLS:
        p = u32s(rows, cols, 1, 0, 0, vectorized)
        width = 1  # lanes per row: the least power of two holding cols at 4 per lane
        while width * 4 < cols:
            width *= 2
        return [Launch(host_name(op, "simd", x.dtype, out_dtype), (ceil_div(rows, K_SOFTMAX_SG * (32 // width)),),
                       (32 * K_SOFTMAX_SG,), [x, y, p])], y
    if cols <= K_BLOCK_COLS:
        threads = min(max(ceil_div(ceil_div(cols, 4), 32) * 32, 32), 1024)
        p = u32s(rows, cols, 1, 0, 0, vectorized)
        return [Launch(host_name(op, "block", x.dtype, out_dtype), (rows,), (threads,), [x, y, p])], y
    chunks = ceil_div(cols, K_CHUNK)
    p = u32s(rows, cols, 1, chunks, K_CHUNK, vectorized)
    partials = torch.empty((rows, chunks, 2), dtype=torch.float32, device=x.device)
    return [Launch(host_name("softmax", "partials", x.dtype), (chunks, rows), (K_SPLIT_THREADS,), [x, partials, p]),
            Launch(host_name(op, "finalize", x.dtype, out_dtype), (chunks, rows), (K_SPLIT_THREADS,),
                   [x, partials, y, p])], y


# ---------------------------------------------------------------- GEMV (csrc/ops/gemv.cpp)

K_DENSE_SG, K_MIN_STEPS, K_MAX_SLICES = 4, 2, 16


def rows_bucket(m: int) -> int:
    return 1 if m <= 1 else 2 if m <= 2 else 4 if m <= 4 else 8


def decode_rows(m: int, groups: int) -> int:
    # csrc/ops/grouped_mm.cpp decode_rows: the average rows of an active group, at least two.
    return max(2, rows_bucket(ceil_div(m, max(1, min(groups, m)))))


def rows_per_simdgroup(bucket: int) -> int:
    return 1 if bucket == 1 else 2


def gemv_geometry(n: int, steps: int, rows: int, split_kernel: str):
    """gemv.cpp gemv_geometry: (slices, grid, threads); slices 1 is dense, four SIMD groups per threadgroup."""
    blocks = ceil_div(n, rows)
    slices = min(K_MAX_SLICES, fill_simdgroups(split_kernel, 32 * K_DENSE_SG) // blocks, steps // K_MIN_STEPS)
    if slices >= 2:
        return slices, (blocks,), (32 * slices,)
    return 1, (ceil_div(blocks, K_DENSE_SG),), (32 * K_DENSE_SG,)


def gemv(x: torch.Tensor, w: torch.Tensor, bias=None):
    """x (m <= 8, k) contiguous rows, w (n, k) with unit column stride."""
    m, k = x.shape
    n = w.shape[0]
    bucket = rows_bucket(m)
    tile = f"m{bucket}_r2"  # gemv.cpp plan: one row of W per SIMD group when one row of x and n fill the GPU
    if bucket == 1 and n >= fill_simdgroups(host_name("gemv", "dense_m1_r1", x.dtype), 32 * K_DENSE_SG):
        tile = "m1_r1"
    per_step = 32 * (16 // x.element_size()) * (2 if bucket == 1 else 1)  # chunks_per_lane (r2)
    slices, grid, threads = 1, (ceil_div(n, K_DENSE_SG),), (32 * K_DENSE_SG,)  # r1: rows enough, never split
    if tile.endswith("r2"):
        slices, grid, threads = gemv_geometry(n, ceil_div(k, per_step), 2, host_name("gemv", f"splitk_{tile}", x.dtype))
    kernel = host_name("gemv", f"{'splitk' if slices > 1 else 'dense'}_{tile}", x.dtype)
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    es = x.element_size()
    w_stride = k if n == 1 else w.stride(0)
    x_stride = k if m == 1 else x.stride(0)
    w_vec = aligned16(w) and (n == 1 or w_stride * es % 16 == 0)
    x_vec = aligned16(x) and (m == 1 or x_stride * es % 16 == 0)
    p = u32s(n, k, m, w_stride, x_stride, n, bias is not None, w_vec, x_vec)
    return [Launch(kernel, grid, threads, [w, x, bias if bias is not None else w, y, p])], y


# ---------------------------------------------------------------- FP8 (csrc/ops/fp8.cpp)

K_AMAX_THREADS, K_AMAX_ELEMENTS = 256, 16384


def fp8_block_params(rows, cols, block_rows, block_cols):
    br = min(block_rows, max(rows, 1))
    bc = min(block_cols, max(cols, 1))
    return br, bc, ceil_div(cols, bc)


def fp8_quantize(x: torch.Tensor, block_rows: int, block_cols: int):
    rows, cols = x.shape
    br, bc, scale_cols = fp8_block_params(rows, cols, block_rows, block_cols)
    scale_rows = ceil_div(rows, br)
    q = torch.empty((rows, cols), dtype=torch.uint8, device=x.device)
    scale = torch.empty((scale_rows, scale_cols), dtype=torch.float32, device=x.device)
    width = min(bc, cols)
    rows_per_group = min(max(K_AMAX_ELEMENTS // width, 1), br)
    amax = torch.zeros(scale.numel(), dtype=torch.int32, device=x.device)
    p = u32s(rows, cols, br, bc, scale_cols, rows_per_group)
    return [Launch(host_name("fp8", "amax", x.dtype), (scale_cols, scale_rows, ceil_div(br, rows_per_group)),
                   (K_AMAX_THREADS,), [x, amax, p]),
            Launch(host_name("fp8", "quantize", x.dtype), (ceil_div(cols, 64), ceil_div(rows, 4)), (64, 4),
                   [x, amax, q, scale, p])], (q, scale)


def fp8_dequantize(q: torch.Tensor, scale: torch.Tensor, block_rows: int, block_cols: int, dtype):
    rows, cols = q.shape
    br, bc, scale_cols = fp8_block_params(rows, cols, block_rows, block_cols)
    out = torch.empty((rows, cols), dtype=dtype, device=q.device)
    p = u32s(rows, cols, br, bc, scale_cols, 0)
    return [Launch(host_name("fp8", "dequantize", dtype), (ceil_div(cols, 64), ceil_div(rows, 4)), (64, 4),
                   [byte_view(q), scale, out, p])], out


def _fp8_matmul(a, w, a_scale, w_scale, block_n, block_k, bias, out, fp8_a):
    m, k = a.shape
    n = w.shape[0]
    bn, bk = min(block_n, n), min(block_k, k)
    scale_cols = ceil_div(k, bk)
    epilogue = block_k >= k
    a_size = a.element_size()
    a_vec = (a.stride(0) * a_size) % 16 == 0 and a.data_ptr() % 16 == 0
    w_vec = w.stride(0) % 16 == 0 and w.data_ptr() % 16 == 0
    few_rows = m <= 8 and (epilogue or bk % 16 == 0)
    variant = f"gemv_m{rows_bucket(m)}" if few_rows else "tiled"
    kernel = (host_name("scaled_mm", variant, torch.uint8, out.dtype) if fp8_a
              else host_name("fp8_linear", variant, a.dtype))
    slices, grid, threads = 1, (ceil_div(n, 32), ceil_div(m, 32)), (128,)
    if few_rows:  # fp8.cpp: the GEMV's geometry; one row of w per SIMD group for one row of a, else four
        slices, grid, threads = gemv_geometry(n, ceil_div(k, 512), 1 if m <= 1 else 4, kernel)
    p = u32s(m, n, k, a.stride(0), w.stride(0), out.stride(0), a_scale is not None,
             1 if a_scale is not None and a_scale.numel() > 1 else 0, bn, bk, scale_cols, epilogue,
             bias is not None, a_vec, w_vec, 0, 0, slices)  # a_e5m2, w_e5m2: e4m3fn operands only here
    return [Launch(kernel, grid, threads, [byte_view(a) if fp8_a else a, byte_view(w),
                                          a_scale if a_scale is not None else w_scale, w_scale,
                                          bias if bias is not None else w_scale, out, p])], out


def scaled_mm(a, b, scale_a, scale_b, out_dtype, bias=None):
    """a (m, k) e4m3fn row-major, b (k, n) e4m3fn column-major (b = w.t())."""
    m, n = a.shape[0], b.shape[1]
    out = torch.empty((m, n), dtype=out_dtype, device=a.device)
    w = b.t()
    w_scale = scale_b.contiguous().view(1 if scale_b.numel() == 1 else n, 1)
    bias_f = bias.float().contiguous() if bias is not None else None
    return _fp8_matmul(a, w, scale_a.contiguous(), w_scale, n if scale_b.numel() == 1 else 1, a.shape[1], bias_f,
                       out, True)


def fp8_linear(x, weight, weight_scale, block_size=None, bias=None):
    n, k = weight.shape
    if block_size:
        block_n, block_k = block_size
    elif weight_scale.numel() != 1:
        block_n, block_k = 1, k
    else:
        block_n, block_k = n, k
    out = torch.empty((x.shape[0], n), dtype=x.dtype, device=x.device)
    scales = weight_scale.float().contiguous().view(ceil_div(n, block_n), -1)
    bias_f = bias.float().contiguous() if bias is not None else None
    return _fp8_matmul(x, weight, None, scales, block_n, block_k, bias_f, out, False)


# ---------------------------------------------------------------- grouped_mm (csrc/ops/grouped_mm.cpp)

K_DECODE_SG, K_DECODE_MIN_STEPS, K_DECODE_MAX_AVG, K_TILE_COLUMNS = 4, 2, 8, 32
SPLIT_NONE, SPLIT_ROWS, SPLIT_COLS, SPLIT_K = 0, 1, 2, 3


def grouped_mm(a: torch.Tensor, b: torch.Tensor, offs=None):
    return _grouped(a, b, offs, "grouped_mm", None)


def fp8_grouped_mm(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, offs: torch.Tensor,
                   block_size=None):
    """x (m, k) contiguous rows sorted by expert, weight (E, n, k) e4m3fn with unit column stride; weight_scale
    per expert (E,), per channel (E, n) or per block (E, ceil(n / bn), ceil(k / bk)) with block_size."""
    e, n, k = weight.shape
    if block_size:
        block_n, block_k = block_size
    elif weight_scale.numel() == e:
        block_n, block_k = n, k
    else:
        block_n, block_k = 1, k
    scales = weight_scale.float().contiguous().view(e, ceil_div(n, block_n), -1)
    fp8 = (scales, min(block_n, n), min(block_k, k))
    return _grouped(x, byte_view(weight).transpose(1, 2), offs, "fp8_grouped_mm", fp8)


def _grouped(a, b, offs, op, fp8):
    """grouped_mm.cpp run_kernels; fp8 (scales, block_n, block_k) for e4m3fn weights, whose kernels read
    the scales at buffer 5 (else b is bound there)."""
    a2, b2 = a.dim() == 2, b.dim() == 2
    if a2 and b2:
        size = [offs.shape[0], a.shape[0], b.shape[1]]
    elif a2:
        size = [a.shape[0], b.shape[-1]]
    elif b2:
        size = [a.shape[1], b.shape[1]]
    else:
        size = [a.shape[0], a.shape[1], b.shape[-1]]
    align = 16 // a.element_size()
    padded = ceil_div(size[-1], align) * align
    stride = [padded, 1] if len(size) == 2 else [size[1] * padded, padded, 1]
    out = torch.empty_strided(size, stride, dtype=a.dtype, device=a.device)
    split = SPLIT_K if a2 and b2 else SPLIT_ROWS if a2 else SPLIT_COLS if b2 else SPLIT_NONE
    groups = offs.shape[0] if offs is not None else a.shape[0]
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    a_group = 0 if a2 else a.stride(0)
    b_group = 0 if b2 else b.stride(0)
    a_row, a_k, b_k, b_col = a.stride(-2), a.stride(-1), b.stride(-2), b.stride(-1)
    out_group = stride[0] if len(stride) == 3 else 0
    out_row = stride[-2]
    es, ws = a.element_size(), b.element_size()
    a_vec = aligned16(a) and a_row * es % 16 == 0 and a_group * es % 16 == 0
    b_vec = aligned16(b) and (b_col if b_k == 1 else b_k) * ws % 16 == 0 and b_group * ws % 16 == 0
    fields = [split, groups, m, n, k, a_group, a_row, a_k, b_group, b_k, b_col, out_group, out_row, a_vec, b_vec]
    scales, block_n, block_k = fp8 or (b, 0, 0)
    fp8_fields = [block_n, block_k, scales.shape[2], scales.stride(0)] if fp8 else [0, 0, 0, 0]
    bufs = lambda slices, chunks: [a, b, offs if offs is not None else a, out,
                                   u32s(*fields, slices, chunks, *fp8_fields), scales]
    average = m // max(groups, 1) if split == SPLIT_ROWS else m
    rows_of_weights = b_k == 1 or k == 1
    # plan_for: the FP8 decode scales 16-byte chunks of a row, so a block along k holds whole chunks.
    decode = (split in (SPLIT_ROWS, SPLIT_NONE) and (a_k == 1 or k == 1) and average <= K_DECODE_MAX_AVG
              and (not fp8 or block_k >= k or block_k % 16 == 0))
    by_rows = split == SPLIT_ROWS
    rows = decode_rows(m, groups) if by_rows else rows_bucket(m)
    if decode and not fp8 and not rows_of_weights and b_col == 1:  # decode_kn_plan: 4 or 2 chunks of 16 bytes
        kernel = host_name(op, f"decode_kn_m{rows}", a.dtype)
        y = m if by_rows else groups * ceil_div(m, rows)
        wide = ceil_div(n, 4 * (16 // es)) * y * K_DECODE_SG
        chunks = 2 if 2 * wide < fill_simdgroups(kernel, 32 * K_DECODE_SG) else 4
        return [Launch(kernel, (ceil_div(n, chunks * (16 // es)), y), (32 * K_DECODE_SG,), bufs(1, chunks))], out
    if decode and (fp8 or rows_of_weights):  # decode_plan: a lane's 16 bytes per step are 16 // ws weights
        runs = ceil_div(m, rows) if by_rows else groups * ceil_div(m, rows)
        blocks = ceil_div(n, rows_per_simdgroup(rows))
        steps = ceil_div(k, 32 * (16 // ws))
        kernel = host_name(op, f"decode_m{rows}", a.dtype)
        fill = fill_simdgroups(kernel, 32 * K_DECODE_SG)
        slices = 1
        while slices < K_DECODE_SG and runs * blocks * slices < fill and steps // (2 * slices) >= K_DECODE_MIN_STEPS:
            slices *= 2
        columns = rows_per_simdgroup(rows) * K_DECODE_SG // slices
        return [Launch(kernel, (ceil_div(n, columns), m if by_rows else runs), (32 * K_DECODE_SG,),
                       bufs(slices, 4))], out
    tm = 16 if average <= 16 else 32 if average <= 32 else 64
    x, y, z = ceil_div(n, K_TILE_COLUMNS), ceil_div(m, tm), 1
    if split == SPLIT_ROWS:
        y += groups
    elif split == SPLIT_COLS:
        x += groups
    else:
        z = groups
    return [Launch(host_name(op, f"tiled_m{tm}", a.dtype), (x, y, z), (128,), bufs(1, 4))], out


# ---------------------------------------------------------------- linalg (csrc/ops/linalg.cpp)

K_TINY_N, K_THREADS_PER_GROUP, K_SOLVE_SG, K_INVERSE_MIN_RHS = 4, 64, 4, 8
F_ADJOINT, F_CONJ_RHS, F_UPPER, F_UNIT = 1, 2, 4, 8


def _bind(t: torch.Tensor) -> torch.Tensor:
    return torch.view_as_real(t) if t.is_complex() else t


def _linalg_params(n, k, batch, a, p_bs=0, b=None, flags=0, transposed_b=False, m=0):
    a_s = (a.stride(0), a.stride(1), a.stride(2))
    b_s = (0, 0, 0) if b is None else (b.stride(0), b.stride(2) if transposed_b else b.stride(1),
                                       b.stride(1) if transposed_b else b.stride(2))
    return u32s(n, k, batch, *a_s, p_bs, *b_s, flags, m)


def lu_factor(A: torch.Tensor):
    """A (batch, n, n)."""
    batch, n = A.shape[0], A.shape[-1]
    buf = torch.empty_like(A)
    piv = torch.empty((batch, n), dtype=torch.int32, device=A.device)
    info = torch.zeros(batch, dtype=torch.int32, device=A.device)
    p = _linalg_params(n, 0, batch, A)
    tiny = n <= K_TINY_N
    kernel = host_name("lu", "factor_thread" if tiny else "factor_simd", A.dtype)
    grid = (ceil_div(batch, K_THREADS_PER_GROUP),) if tiny else (batch,)
    return [Launch(kernel, grid, (K_THREADS_PER_GROUP if tiny else 32,),
                   [_bind(A), _bind(buf), piv, info, p])], (buf.mT, piv, info)


def lu_solve(LU: torch.Tensor, piv: torch.Tensor, B: torch.Tensor, adjoint=False):
    batch, n, k = B.shape
    buf = torch.empty((batch, k, n), dtype=B.dtype, device=B.device)
    p = _linalg_params(n, k, batch, LU, n, B, F_ADJOINT if adjoint else 0)
    tiny = n <= K_TINY_N
    kernel = host_name("lu", "solve_thread" if tiny else "solve_simd", B.dtype)
    grid = (ceil_div(batch, K_THREADS_PER_GROUP),) if tiny else (ceil_div(batch * k, K_SOLVE_SG),)
    return [Launch(kernel, grid, (K_THREADS_PER_GROUP if tiny else 32 * K_SOLVE_SG,),
                   [_bind(LU), piv.contiguous(), _bind(B), _bind(buf), p])], buf.mT


def solve(A: torch.Tensor, B: torch.Tensor):
    """linalg.solve for A (batch, n, n), B (batch, n, k): fused for n <= 4, else factor + solve."""
    batch, n, k = B.shape
    if n > K_TINY_N:
        l1, (LU, piv, info) = lu_factor(A)
        l2, X = lu_solve(LU, piv, B)
        return l1 + l2, X
    lu_buf = torch.empty_like(A)
    x_buf = torch.empty((batch, k, n), dtype=A.dtype, device=A.device)
    piv = torch.empty((batch, n), dtype=torch.int32, device=A.device)
    info = torch.empty(batch, dtype=torch.int32, device=A.device)
    p = _linalg_params(n, k, batch, A, 0, B, 0)
    return [Launch(host_name("lu", "solve_fused_thread", A.dtype), (ceil_div(batch, K_THREADS_PER_GROUP),),
                   (K_THREADS_PER_GROUP,), [_bind(A), _bind(B), _bind(x_buf), _bind(lu_buf), piv, info, p])], x_buf.mT


def inverse(A: torch.Tensor):
    """linalg.inv_ex for A (batch, n, n): one dispatch factors and inverts (a thread per matrix for n <= 4,
    else a SIMD group)."""
    batch, n = A.shape[0], A.shape[-1]
    buf = torch.empty_like(A)
    info = torch.zeros(batch, dtype=torch.int32, device=A.device)
    p = _linalg_params(n, n, batch, A)
    tiny = n <= K_TINY_N
    grid = (ceil_div(batch, K_THREADS_PER_GROUP),) if tiny else (batch,)
    return [Launch(host_name("lu", "inverse_thread" if tiny else "inverse_simd", A.dtype), grid,
                   (K_THREADS_PER_GROUP if tiny else 32,), [_bind(A), _bind(buf), info, p])], (buf.mT, info)


def householder_product(V: torch.Tensor, tau: torch.Tensor, cols=None):
    """The first `cols` (default: V's) columns of the product of V's (batch, m, n) reflectors."""
    batch, m, n = V.shape
    k, cols = tau.shape[-1], cols or n
    buf = torch.empty((batch, cols, m), dtype=V.dtype, device=V.device)
    p = _linalg_params(cols, k, batch, V, k, m=m)
    return [Launch(host_name("qr", "householder_simd", V.dtype), (batch,), (32,),
                   [_bind(V), _bind(tau.contiguous()), _bind(buf), p])], buf.mT


def qr(A: torch.Tensor, mode="reduced"):
    """linalg.qr for A (batch, m, n): geqrf, then (unless mode "r") the product of its reflectors. Returns
    (launches, (Q or None, the factors: R in the upper triangle))."""
    batch, m, n = A.shape
    k = min(m, n)
    factors = torch.empty((batch, n, m), dtype=A.dtype, device=A.device)
    tau = torch.empty((batch, k), dtype=A.dtype, device=A.device)
    launches = [Launch(host_name("qr", "geqrf_simd", A.dtype), (batch,), (32,),
                       [_bind(A), _bind(factors), _bind(tau), _linalg_params(n, k, batch, A, m=m)])]
    if mode == "r":
        return launches, (None, factors.mT)
    more, Q = householder_product(factors.mT, tau, m if mode == "complete" else k)
    return launches + more, (Q, factors.mT)


def solve_triangular(A: torch.Tensor, B: torch.Tensor, upper: bool, unit=False):
    """Left solves: A (batch, n, n), B (batch, n, k)."""
    batch, n, k = B.shape
    buf = torch.empty((batch, k, n), dtype=B.dtype, device=B.device)
    p = _linalg_params(n, k, batch, A, 0, B, (F_UPPER if upper else 0) | (F_UNIT if unit else 0))
    inverse = A.dtype == torch.float32 and n in (16, 32, 64) and k >= K_INVERSE_MIN_RHS
    kernel = host_name("trsm", "inverse" if inverse else "simd", A.dtype)
    grid = (batch,) if inverse else (ceil_div(batch * k, K_SOLVE_SG),)
    return [Launch(kernel, grid, (n if inverse else 32 * K_SOLVE_SG,), [_bind(A), _bind(B), _bind(buf), p])], buf.mT
