"""The cases the CUDA check runs: each op at odd small sizes (every host name
at least once: the correctness sweep and what the sanitizers run) and at real
model sizes (parity with torch's CUDA op, achieved bandwidth).

A case builds its inputs (fresh random data, on the CPU), runs the mps_ext op
on them in a recording (replay.py: the host's own plan), poisons its outputs
and puts the recording on the GPU; it computes a float64 reference on the GPU
(GPU copies of the inputs) and, for the large ones, times torch's own CUDA op
beside it.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch
import torch.nn.functional as F

import mps_ext
from cuda import DEV
from replay import Replay, record

F32, F16, BF16, C64 = torch.float32, torch.float16, torch.bfloat16, torch.complex64
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
DT = {F32: "fp32", F16: "fp16", BF16: "bf16", C64: "c64", E4M3: "e4m3fn", E5M2: "e5m2"}
# Relative L2 error allowed against a float64 reference, by output dtype: the
# output's own rounding plus float accumulation; float8 outputs against the
# reference rounded to their format (a few elements one step apart where float
# accumulation lands on the other side of a rounding boundary).
TOL = {F32: 2e-5, F16: 2e-3, BF16: 1.6e-2, C64: 2e-5, E4M3: 1e-2, E5M2: 1e-2}


@dataclasses.dataclass
class Case:
    family: str
    name: str
    replay: Replay
    check: Callable[[], tuple[bool, str]]  # once the replay ran and was downloaded
    bytes: int = 0  # the fewest bytes the op must move (inputs once, outputs once)
    flops: int = 0
    torch_fn: Callable[[], object] | None = None
    torch_note: str = ""
    note: str = ""


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out = out.to(ref.device)
    out, ref = out.to(torch.complex128 if out.is_complex() else torch.float64), ref.to(out.dtype if out.is_complex()
                                                                                         else torch.float64)
    finite = torch.isfinite(ref)
    if not torch.equal(torch.isfinite(out), finite) or not torch.equal(torch.isnan(out), torch.isnan(ref)):
        return float("inf")
    if not finite.all() and not torch.equal(out[~finite & ~torch.isnan(ref)], ref[~finite & ~torch.isnan(ref)]):
        return float("inf")
    d = (out[finite] - ref[finite]).abs().norm()
    n = ref[finite].abs().norm()
    return float(d / n) if n > 0 else float(d)


def compare(out, ref, dtype, extra=1.0, torch_out=None):
    def check():
        e = rel_err(out, ref)
        tol = TOL[dtype] * extra
        msg = f"rel err {e:.2e} (tol {tol:.0e})"
        if torch_out is not None:
            t = torch_out() if callable(torch_out) else torch_out
            msg += f"; torch {rel_err(t, ref):.2e}"
        return e <= tol, msg
    return check


def poison(t: torch.Tensor):
    if t.is_floating_point() or t.is_complex():
        t.fill_(float("nan"))
    else:
        t.fill_(0x7F if t.dtype == torch.uint8 else -7)


def randn(*shape, dtype=F32, scale=1.0):
    """On the CPU, where the ops record; drawn on DEV (fast at model sizes); complex with both parts drawn."""
    drawn = torch.complex64 if dtype.is_complex else F32
    return (torch.randn(*shape, device=DEV, dtype=drawn) * scale).to(dtype).cpu()


def on_dev(*ts):
    """DEV copies (None stays None) for references and torch's own ops."""
    return tuple(None if t is None else t.to(DEV) for t in ts)


def nbytes(*ts) -> int:
    return sum(t.numel() * t.element_size() for t in ts)


# ---------------------------------------------------------------- softmax

def softmax_case(shape, dim, log, dt_in, dt_out=None, large=False, special=False, unaligned=False):
    dt_out = dt_out or dt_in
    x = randn(*shape, dtype=dt_in, scale=4.0)
    if unaligned:
        x = offset_view(x)
    if special:
        x.view(-1)[::97] = float("-inf")
        x.view(-1)[5] = float("inf") if log else x.view(-1)[5]
    recording, y = record(mps_ext.log_softmax if log else mps_ext.softmax, x, dim, dtype=dt_out)
    poison(y)
    fn = torch.log_softmax if log else torch.softmax
    (x,) = on_dev(x)
    ref = fn(x.double(), dim)
    name = (f"{'log_' if log else ''}softmax {tuple(shape)} dim={dim} {DT[dt_in]}->{DT[dt_out]}"
            f"{' unaligned' if unaligned else ''}")
    tfn = lambda: fn(x, dim, dtype=dt_out)
    return Case("softmax", name, Replay(recording), compare(y, ref, dt_out, torch_out=tfn if large else None),
                nbytes(x, y), 0, tfn if large else None)


def softmax_small():
    cases = []
    for dt_in, dt_out in ((F32, F32), (F16, F16), (BF16, BF16), (F16, F32), (BF16, F32)):
        for log in (False, True):
            cases += [softmax_case((37, 100), -1, log, dt_in, dt_out),
                      softmax_case((5, 1000), -1, log, dt_in, dt_out, special=True),
                      softmax_case((3, 999), -1, log, dt_in, dt_out),
                      softmax_case((3, 5003), -1, log, dt_in, dt_out),
                      softmax_case((2, 37, 600), 1, log, dt_in, dt_out),
                      softmax_case((3, 5000), -1, log, dt_in, dt_out, unaligned=True)]
    return cases


def softmax_large():
    return [softmax_case((256, 151936), -1, False, F32, large=True),
            softmax_case((256, 151936), -1, False, BF16, large=True),
            softmax_case((256, 151936), -1, True, F16, large=True),
            softmax_case((256, 151936), -1, True, BF16, F32, large=True),
            softmax_case((16384, 4096), -1, False, BF16, large=True),
            softmax_case((16384, 4096), -1, True, F32, large=True),
            softmax_case((1 << 20, 128), -1, False, F32, large=True),
            softmax_case((1 << 21, 64), -1, False, BF16, large=True),
            softmax_case((32, 4096, 256), 1, False, F32, large=True)]


# ---------------------------------------------------------------- GEMV

def offset_view(t: torch.Tensor, offset=1) -> torch.Tensor:
    """The same values one element past a 16-byte boundary: the kernels' per-element load paths."""
    buf = torch.empty(t.numel() + offset, dtype=t.dtype, device=t.device)
    view = buf[offset:].view(t.shape)
    view.copy_(t)
    return view


def padded_rows(t: torch.Tensor, pad=3) -> torch.Tensor:
    """t (rows, cols) with a row stride of cols + pad."""
    buf = torch.empty(t.shape[0], t.shape[1] + pad, dtype=t.dtype, device=t.device)
    buf[:, :t.shape[1]] = t
    return buf[:, :t.shape[1]]


def gemv_case(m, n, k, dt, bias=False, large=False, unaligned=False, k_major=False):
    x, w = randn(m, k, dtype=dt), randn(n, k, dtype=dt, scale=k ** -0.5)
    if unaligned:
        x = offset_view(x)
    if k_major:  # stored (k, n), as transformers' Conv1D holds it: gemv_t
        w = (padded_rows(w.t().contiguous()) if unaligned else w.t().contiguous()).t()
    elif unaligned:
        w = padded_rows(w)
    b = randn(n, dtype=dt) if bias else None
    recording, y = record(mps_ext.linear, x, w, b)
    poison(y)
    x, w, b = on_dev(x, w, b)
    ref = x.double() @ w.double().T + (b.double() if bias else 0)
    tfn = lambda: F.linear(x, w, b)
    return Case("gemv", f"linear m={m} n={n} k={k} {DT[dt]}{' +bias' if bias else ''}"
                f"{' W stored k-major' if k_major else ''}"
                f"{' unaligned x, padded W rows' if unaligned else ''}", Replay(recording),
                compare(y, ref, dt, torch_out=tfn if large else None), nbytes(x, w, y) + (nbytes(b) if bias else 0),
                2 * m * n * k, tfn if large else None)


def gemv_small():
    cases = []
    for dt in (F32, F16, BF16):
        for i, m in enumerate((1, 2, 3, 7)):
            cases.append(gemv_case(m, 1001, 300, dt, bias=i % 2 == 0))   # dense
            cases.append(gemv_case(m, 37, 3000, dt, bias=i % 2 == 1))    # split K
        cases += [gemv_case(3, 1001, 300, dt, unaligned=True), gemv_case(1, 37, 3000, dt, unaligned=True)]
        # One weight row per SIMD group: rows enough to fill the GPU (an H200 keeps at most 132 x 64 warps)
        cases.append(gemv_case(1, 9000, 40, dt))
        for i, m in enumerate((1, 2, 3, 7)):  # W stored k-major, columns past whole 16-byte loads
            cases.append(gemv_case(m, 1001, 300, dt, bias=i % 2 == 0, k_major=True))
        cases.append(gemv_case(2, 333, 70, dt, unaligned=True, k_major=True))
    return cases


def gemv_large():
    return [gemv_case(1, 14336, 4096, F16, large=True), gemv_case(1, 14336, 4096, BF16, large=True),
            gemv_case(1, 14336, 4096, F32, large=True), gemv_case(8, 14336, 4096, BF16, large=True),
            gemv_case(1, 4096, 14336, BF16, large=True), gemv_case(1, 128, 7168, BF16, large=True),
            gemv_case(1, 3072, 768, F32, bias=True, large=True, k_major=True)]  # GPT-2's c_fc, stored (k, n)


# ---------------------------------------------------------------- FP8

def e4m3(t):
    return t.to(torch.float8_e4m3fn)


def quantize_case(rows, cols, br, bc, dt, large=False):
    x = randn(rows, cols, dtype=dt, scale=3.0)
    recording, (q, scale) = record(mps_ext.fp8.quantize, x, block=(br, bc))
    poison(q)
    poison(scale)
    q = q.view(torch.uint8)
    (x,) = on_dev(x)

    def reference():
        xf = x.float()
        sr, sc = -(-rows // min(br, rows)), -(-cols // min(bc, cols))
        pad = torch.zeros(sr * min(br, rows), sc * min(bc, cols), device=DEV)
        pad[:rows, :cols] = xf.abs()
        amax = pad.view(sr, min(br, rows), sc, min(bc, cols)).amax(dim=(1, 3))
        # A tensor divisor: torch turns `tensor / python scalar` into a multiply by its reciprocal on CUDA.
        s = torch.where(amax == 0, torch.ones_like(amax), amax / torch.full_like(amax, 448.0))
        full = s.repeat_interleave(min(br, rows), 0)[:rows].repeat_interleave(min(bc, cols), 1)[:, :cols]
        return e4m3(xf / full).view(torch.uint8), s

    def check():
        q_ref, s_ref = reference()
        q_out, s_out = on_dev(q, scale)
        bad = int((q_out != q_ref).sum())
        same_scales = torch.equal(s_out, s_ref)
        return bad == 0 and same_scales, (f"{bad} of {q.numel()} bytes differ from torch's e4m3fn conversion; "
                                          f"scales {'equal' if same_scales else 'DIFFER'}")

    return Case("fp8", f"fp8.quantize ({rows}, {cols}) blocks ({br}, {bc}) {DT[dt]}", Replay(recording), check,
                nbytes(x, q, scale), 0, (lambda: reference()) if large else None,
                "torch: amax, divide, .to(float8_e4m3fn) (several kernels)")


def dequantize_case(rows, cols, br, bc, dt, large=False):
    x = randn(rows, cols, scale=3.0)
    q = e4m3(x)
    sr, sc = -(-rows // min(br, rows)), -(-cols // min(bc, cols))
    scale = torch.rand(sr, sc) + 0.5
    recording, out = record(mps_ext.fp8.dequantize, q, scale, dt, block=(br, bc))
    poison(out)
    q, scale = on_dev(q, scale)
    full = scale.repeat_interleave(min(br, rows), 0)[:rows].repeat_interleave(min(bc, cols), 1)[:, :cols]
    ref = q.double() * full.double()
    tfn = lambda: (q.float() * full).to(dt)
    return Case("fp8", f"fp8.dequantize ({rows}, {cols}) blocks ({br}, {bc}) ->{DT[dt]}", Replay(recording),
                compare(out, ref, dt), nbytes(q, scale, out), 0, tfn if large else None,
                "torch: convert and multiply (expanded scales)")


def scaled_mm_case(m, n, k, out_dt, rowwise, bias=False, large=False, unaligned=False, scale_result=None):
    """A float8 out_dtype is the float result times 1 / scale_result, converted (scaled_mm_encode_*)."""
    a = e4m3(randn(m, k, scale=2.0))
    w = e4m3(randn(n, k, scale=2.0))
    if unaligned:
        a, w = padded_rows(a), padded_rows(w)
    b = w.t()
    if rowwise:
        sa, sb = torch.rand(m, 1) + 0.5, torch.rand(1, n) + 0.5
    else:
        sa, sb = torch.tensor([[0.7]]), torch.tensor([[1.3]])
    bias_t = randn(n, dtype=out_dt) if bias else None
    sr = None if scale_result is None else torch.tensor(scale_result)
    recording, out = record(mps_ext.scaled_mm, a, b, sa, sb, bias=bias_t, out_dtype=out_dt, scale_result=sr)
    poison(out)
    a, b, sa, sb, bias_t = on_dev(a, b, sa, sb, bias_t)
    ref = (a.double() * sa.double()) @ (b.double() * sb.double()) + (bias_t.double() if bias else 0)
    if out_dt in (E4M3, E5M2):
        ref = (ref / (1.0 if scale_result is None else scale_result)).to(out_dt).double()

    def tfn():
        if m % 16 == 0:
            return torch._scaled_mm(a, b, sa.view(-1, 1) if rowwise else sa.view(()),
                                    sb.view(1, -1) if rowwise else sb.view(()), bias=bias_t, out_dtype=out_dt)
        # torch needs m % 16 == 0: time it on a padded a
        ap = torch.zeros(16, k, device=DEV).to(torch.float8_e4m3fn)
        ap[:m] = a
        sap = torch.ones(16, 1, device=DEV)
        sap[:m] = sa if rowwise else sa.expand(m, 1)
        return torch._scaled_mm(ap, b, sap if rowwise else sa.view(()), sb.view(1, -1) if rowwise else sb.view(()),
                                bias=bias_t, out_dtype=out_dt)[:m]

    kind = ("row-wise" if rowwise else "tensor-wise") + (", padded rows" if unaligned else "")
    return Case("fp8", f"scaled_mm m={m} n={n} k={k} {kind} ->{DT[out_dt]}", Replay(recording),
                compare(out, ref, out_dt, torch_out=tfn if large else None),
                nbytes(a, w, out), 2 * m * n * k, tfn if large else None,
                "torch._scaled_mm" + (" (a padded to 16 rows)" if m % 16 else ""))


def fp8_linear_case(m, n, k, dt, block, bias=False, large=False):
    x = randn(m, k, dtype=dt)
    w = e4m3(randn(n, k, scale=2.0))
    ws = torch.rand(n) + 0.5 if block is None else torch.rand(-(-n // block[0]), -(-k // block[1])) + 0.5
    bias_t = randn(n, dtype=dt) if bias else None
    recording, out = record(mps_ext.fp8_linear, x, w, ws, bias=bias_t, block_size=block)
    poison(out)
    x, w, ws, bias_t = on_dev(x, w, ws, bias_t)
    if block is None:
        full = ws.view(n, 1).expand(n, k)
    else:
        bn, bk = block
        full = ws.repeat_interleave(bn, 0)[:n].repeat_interleave(bk, 1)[:, :k]
    wd = w.double() * full.double()
    ref = x.double() @ wd.T + (bias_t.double() if bias else 0)
    w_dense = (w.float() * full).to(dt)
    tfn = lambda: F.linear(x, w_dense, bias_t)
    return Case("fp8", f"fp8_linear m={m} n={n} k={k} {DT[dt]} blocks {block or 'per-row'}", Replay(recording),
                compare(out, ref, dt, torch_out=tfn if large else None),
                nbytes(x, w, ws, out), 2 * m * n * k, tfn if large else None,
                f"torch: F.linear with the weight dequantized to {DT[dt]} (reads 2x the weight bytes)")


def fp8_small():
    cases = []
    for dt in (F32, F16, BF16):
        cases += [quantize_case(37, 300, 16, 128, dt), quantize_case(37, 300, 1, 300, dt),
                  dequantize_case(37, 300, 16, 128, dt)]
        for i, m in enumerate((1, 2, 3, 7)):
            cases.append(scaled_mm_case(m, 40, 160, dt, rowwise=i % 2 == 0, bias=i == 3))
            cases.append(fp8_linear_case(m, 40, 160, dt, (16, 32) if i % 2 else None, bias=i == 2))
        cases.append(scaled_mm_case(37, 40, 72, dt, rowwise=True, bias=True))
        cases.append(fp8_linear_case(37, 40, 72, dt, (16, 24)))
        cases.append(scaled_mm_case(3, 40, 160, dt, rowwise=True, unaligned=True))
        # one row: streamed past w with whole and partial chunks of K, and past what a threadgroup holds
        cases.append(fp8_linear_case(1, 40, 1040, dt, (16, 32)))
        cases.append(scaled_mm_case(1, 6, 16400, dt, rowwise=True))
        cases.append(fp8_linear_case(1, 6, 16400, dt, None, bias=True))
    # float8 outputs
    cases += [scaled_mm_case(5, 40, 160, E4M3, rowwise=True, scale_result=4.0),
              scaled_mm_case(20, 40, 72, E5M2, rowwise=False)]
    return cases


def fp8_large():
    return [scaled_mm_case(1, 14336, 4096, BF16, rowwise=False, large=True),
            scaled_mm_case(1, 14336, 4096, BF16, rowwise=True, large=True),
            scaled_mm_case(8, 14336, 4096, BF16, rowwise=True, large=True),
            scaled_mm_case(512, 14336, 4096, BF16, rowwise=True, large=True),
            fp8_linear_case(1, 14336, 4096, BF16, (128, 128), large=True),
            fp8_linear_case(4, 14336, 4096, F16, None, large=True),
            fp8_linear_case(1, 4096, 14336, BF16, None, large=True),
            fp8_linear_case(256, 14336, 4096, BF16, (128, 128), large=True),
            quantize_case(4096, 14336, 1, 14336, BF16, large=True),
            quantize_case(4096, 14336, 128, 128, BF16, large=True),
            dequantize_case(4096, 14336, 128, 128, BF16, large=True)]


# ---------------------------------------------------------------- grouped_mm

def partition(total, groups, empty_every=0):
    """int32 cumulative ends of `groups` random sizes summing to `total` (some empty)."""
    w = torch.rand(groups)
    if empty_every:
        w[::empty_every] = 0
    sizes = torch.floor(w / w.sum() * total).long()
    sizes[-1] += total - sizes.sum()
    return torch.cumsum(sizes, 0).to(torch.int32)


def grouped_ref(a, b, offs):
    """The float64 result and a function selecting the part of an output the groups cover."""
    a64, b64 = a.double(), b.double()
    whole = lambda t: t
    if a.dim() == 3 and b.dim() == 3:
        return a64 @ b64, whole
    ends = offs.tolist()
    starts = [0] + ends[:-1]
    if a.dim() == 2 and b.dim() == 3:
        out = torch.zeros(a.shape[0], b.shape[-1], dtype=torch.float64, device=DEV)
        for g, (s, e) in enumerate(zip(starts, ends)):
            out[s:e] = a64[s:e] @ b64[g]
        return out, lambda t: t[:ends[-1]]
    if a.dim() == 3 and b.dim() == 2:
        out = torch.zeros(a.shape[1], b.shape[1], dtype=torch.float64, device=DEV)
        for g, (s, e) in enumerate(zip(starts, ends)):
            out[:, s:e] = a64[g] @ b64[:, s:e]
        return out, lambda t: t[:, :ends[-1]]
    out = torch.zeros(len(ends), a.shape[0], b.shape[1], dtype=torch.float64, device=DEV)
    for g, (s, e) in enumerate(zip(starts, ends)):
        out[g] = a64[:, s:e] @ b64[s:e]
    return out, whole


def grouped_case(kind, dt, groups, m, n, k, large=False, empty_every=0):
    """kind: decode/rows (2D a x 3D b, b the transposed expert weights), decode_kn (2D a x 3D b stored
    (G, K, N)), none (3D x 3D), none_kn (3D x 3D, b stored (G, K, N)), cols (3D x 2D), k (2D x 2D)."""
    offs = None
    if kind in ("decode", "rows"):
        a = randn(m, k, dtype=dt)
        b = randn(groups, n, k, dtype=dt, scale=k ** -0.5).transpose(-2, -1)
        offs = partition(m, groups, empty_every)
    elif kind == "decode_kn":
        a = randn(m, k, dtype=dt)
        b = randn(groups, k, n, dtype=dt, scale=k ** -0.5)
        offs = partition(m, groups, empty_every)
    elif kind == "none":
        a, b = randn(groups, m, k, dtype=dt), randn(groups, n, k, dtype=dt, scale=k ** -0.5).transpose(-2, -1)
    elif kind == "none_kn":
        a, b = randn(groups, m, k, dtype=dt), randn(groups, k, n, dtype=dt, scale=k ** -0.5)
    elif kind == "cols":
        a, b = randn(groups, m, k, dtype=dt), randn(n, k, dtype=dt, scale=k ** -0.5).t()
        offs = partition(n, groups, empty_every)
    else:
        a, b = randn(m, k, dtype=dt), randn(n, k, dtype=dt, scale=k ** -0.5).t()
        offs = partition(k, groups, empty_every)
    recording, out = record(mps_ext.grouped_mm, a, b, offs)
    poison(out)
    used = 0 if offs is None else torch.unique(torch.bucketize(torch.arange(m), offs.long(), right=True)).numel()
    a, b, offs = on_dev(a, b, offs)
    ref, covered = grouped_ref(a, b, offs)
    tfn = lambda: torch._grouped_mm(a, b, offs)

    def check():
        # Only what the groups cover is written, as in torch.
        ok, msg = compare(covered(out), covered(ref), dt)()
        if large:
            try:
                msg += f"; torch {rel_err(covered(tfn()), covered(ref)):.2e}"
            except Exception as e:  # noqa: BLE001 - torch may not support this dtype or layout
                msg += f"; torch._grouped_mm unavailable ({type(e).__name__})"
        return ok, msg

    if kind in ("decode", "decode_kn", "rows"):
        moved = used * n * k * a.element_size() + nbytes(a) + m * n * a.element_size()
    else:
        moved = nbytes(a, b, out)
    flops = 2 * m * n * k * (groups if kind.startswith("none") else 1)
    return Case("grouped_mm", f"grouped_mm {kind} G={groups} m={m} n={n} k={k} {DT[dt]}", Replay(recording), check,
                moved,
                flops, tfn if large else None, "torch._grouped_mm")


def fp8_grouped_case(dt, groups, m, n, k, block=None, large=False, empty_every=0):
    """x (m, k) rows sorted by expert times e4m3fn experts (G, n, k), per-channel scales or per block."""
    x = randn(m, k, dtype=dt)
    w = e4m3(randn(groups, n, k, scale=2.0))
    if block is None:
        ws = torch.rand(groups, n) + 0.5
    else:
        ws = (torch.rand(groups, -(-n // block[0]), -(-k // block[1])) + 0.5) * k ** -0.5
    offs = partition(m, groups, empty_every)
    recording, out = record(mps_ext.fp8_grouped_mm, x, w, ws, offs, block_size=block)
    poison(out)
    used = torch.unique(torch.bucketize(torch.arange(m), offs.long(), right=True)).numel()
    x, w, ws, offs = on_dev(x, w, ws, offs)
    if block is None:
        full = ws.view(groups, n, 1).expand(groups, n, k)
    else:
        bn, bk = block
        full = ws.repeat_interleave(bn, 1)[:, :n].repeat_interleave(bk, 2)[:, :, :k]
    deq = w.double() * full.double()
    ref, covered = grouped_ref(x, deq.transpose(-2, -1), offs)
    w_dense = (w.float() * full).to(dt).transpose(-2, -1)
    tfn = lambda: torch._grouped_mm(x, w_dense, offs)
    moved = used * n * k + nbytes(x, ws) + m * n * x.element_size()
    return Case("grouped_mm", f"fp8_grouped_mm G={groups} m={m} n={n} k={k} {DT[dt]} blocks {block or 'per-row'}",
                Replay(recording), compare(covered(out), covered(ref), dt, torch_out=(lambda: covered(tfn())) if large else None),
                moved, 2 * m * n * k, tfn if large else None,
                f"torch: _grouped_mm with the experts dequantized to {DT[dt]} (reads 2x the weight bytes)")


def grouped_small():
    cases = []
    for dt in (F32, F16, BF16):
        # decode with 8, 4, 2 and 1 rows per threadgroup (5, 2, 2 and 1 rows per active group), K split; the
        # 1-row kernels (batched 3D x 3D with one row) and decode along N with 4 rows (3.4 per group)
        cases += [grouped_case("decode", dt, 5, 21, 40, 48, empty_every=3),
                  grouped_case("decode", dt, 6, 20, 40, 1030, empty_every=2),
                  grouped_case("decode", dt, 8, 13, 24, 520),
                  grouped_case("decode", dt, 64, 9, 24, 300, empty_every=2),
                  grouped_case("decode_kn", dt, 5, 21, 72, 48, empty_every=3),
                  grouped_case("decode_kn", dt, 64, 9, 24, 300, empty_every=2),
                  grouped_case("decode_kn", dt, 5, 17, 40, 48),
                  grouped_case("none", dt, 3, 1, 40, 56),
                  grouped_case("none_kn", dt, 3, 1, 40, 56),
                  grouped_case("none_kn", dt, 2, 3, 24, 40),
                  grouped_case("rows", dt, 4, 50, 40, 40),      # TM 16
                  grouped_case("rows", dt, 3, 80, 33, 40),      # TM 32
                  grouped_case("rows", dt, 2, 150, 40, 36, empty_every=2),  # TM 64
                  grouped_case("none", dt, 3, 20, 40, 24),
                  grouped_case("cols", dt, 3, 20, 70, 24),
                  grouped_case("k", dt, 3, 20, 40, 70),
                  # FP8 experts: streamed for up to 2 rows per expert (8 bytes per lane: K = 520; 16: K = 1024,
                  # and unaligned rows at K = 1500), decode with 2, 4 and 8 rows per run (2: a K too long to
                  # stream), K split; tiles of 16, 32 and 64 rows, and a block along K the decode cannot scale by
                  # 8-byte chunks (tiled at 2 rows per expert)
                  fp8_grouped_case(dt, 6, 9, 37, 1024),
                  fp8_grouped_case(dt, 4, 7, 40, 1500, (16, 128), empty_every=2),
                  fp8_grouped_case(dt, 3, 5, 16, 16400),
                  fp8_grouped_case(dt, 6, 20, 40, 2100, empty_every=2),
                  fp8_grouped_case(dt, 5, 21, 40, 300, (16, 128), empty_every=3),
                  fp8_grouped_case(dt, 8, 13, 24, 520, (16, 32)),
                  fp8_grouped_case(dt, 4, 50, 40, 40, (16, 24)),
                  fp8_grouped_case(dt, 3, 80, 33, 72),
                  fp8_grouped_case(dt, 2, 150, 40, 36, (32, 16), empty_every=2),
                  fp8_grouped_case(dt, 5, 11, 40, 48, (16, 20))]
    return cases


def grouped_large():
    return [grouped_case("decode", BF16, 128, 8, 1536, 2048, large=True),
            grouped_case("decode", BF16, 128, 32, 1536, 2048, large=True),
            grouped_case("decode", BF16, 128, 128, 1536, 2048, large=True),
            grouped_case("decode", BF16, 128, 1024, 1536, 2048, large=True),
            grouped_case("decode_kn", BF16, 32, 4, 5760, 2880, large=True),
            grouped_case("decode_kn", BF16, 32, 16, 2880, 2880, large=True),
            grouped_case("rows", BF16, 128, 32768, 1536, 2048, large=True),
            grouped_case("rows", F32, 128, 8192, 768, 2048, large=True),
            # Qwen3-30B-A3B's experts in FP8 with 128 x 128 blocks: gate/up for one token (8 routed), 32, a
            # prompt; down for one token
            fp8_grouped_case(BF16, 128, 8, 1536, 2048, (128, 128), large=True),
            fp8_grouped_case(BF16, 128, 8, 2048, 768, (128, 128), large=True),
            fp8_grouped_case(BF16, 128, 32, 1536, 2048, (128, 128), large=True),
            fp8_grouped_case(BF16, 128, 4096, 1536, 2048, (128, 128), large=True)]


# ---------------------------------------------------------------- linalg

def well_conditioned(batch, n, dt):
    A = torch.randn(batch, n, n, dtype=dt, device=DEV).cpu()
    return A + n * torch.eye(n, dtype=dt)


def lu_factor_case(batch, n, dt, large=False):
    A = well_conditioned(batch, n, dt)
    A[0] = torch.randn(n, n, dtype=dt)  # one system without a dominant diagonal: pivoting matters
    recording, (LU, piv, info) = record(mps_ext.lu_factor_ex, A)
    poison(LU)

    def check():
        # LAPACK's pivots (icamax: |re| + |im| for complex), as the kernels promise; cuSOLVER may pick others.
        LU_t, piv_t = torch.linalg.lu_factor(A)
        same_piv = torch.equal(piv.to(piv_t.dtype), piv_t)
        e = rel_err(LU, LU_t)
        ok = same_piv and e <= TOL[dt] * 10 and int(info.abs().sum()) == 0
        return ok, f"LU rel err vs LAPACK {e:.2e}; pivots {'equal' if same_piv else 'DIFFER'}"

    (A_dev,) = on_dev(A)
    return Case("linalg", f"lu_factor batch={batch} n={n} {DT[dt]} (vs LAPACK)", Replay(recording), check,
                nbytes(A) * 2 + batch * n * 4, 0, (lambda: torch.linalg.lu_factor(A_dev)) if large else None,
                "torch.linalg.lu_factor")


def solve_case(batch, n, k, dt, large=False):
    A, B = well_conditioned(batch, n, dt), randn(batch, n, k, dtype=dt)
    recording, (X, _) = record(mps_ext.solve_ex, A, B)
    poison(X)
    A, B = on_dev(A, B)
    ref = torch.linalg.solve(A.to(torch.complex128 if dt == C64 else torch.float64),
                             B.to(torch.complex128 if dt == C64 else torch.float64))
    tfn = lambda: torch.linalg.solve(A, B)
    return Case("linalg", f"solve batch={batch} n={n} k={k} {DT[dt]}", Replay(recording),
                compare(X, ref, dt, extra=10, torch_out=tfn if large else None), nbytes(A, B, X) + nbytes(A), 0,
                tfn if large else None, "torch.linalg.solve")


def lu_solve_case(batch, n, k, dt, adjoint=False, large=False):
    A, B = well_conditioned(batch, n, dt), randn(batch, n, k, dtype=dt)
    LU, piv = torch.linalg.lu_factor(A)
    recording, X = record(mps_ext.lu_solve, LU, piv, B, adjoint=adjoint)
    poison(X)
    A, B, LU, piv = on_dev(A, B, LU, piv)
    wide = torch.complex128 if dt == C64 else torch.float64
    A64 = A.to(wide).mH if adjoint else A.to(wide)
    ref = torch.linalg.solve(A64, B.to(wide))
    tfn = lambda: torch.linalg.lu_solve(LU, piv, B, adjoint=adjoint)
    return Case("linalg", f"lu_solve batch={batch} n={n} k={k} {DT[dt]}{' adjoint' if adjoint else ''}",
                Replay(recording),
                compare(X, ref, dt, extra=10, torch_out=tfn if large else None), nbytes(LU, B, X) + piv.numel() * 4,
                0, tfn if large else None, "torch.linalg.lu_solve")


def inv_case(batch, n, dt, large=False):
    A = well_conditioned(batch, n, dt)
    recording, (X, _) = record(mps_ext.inv_ex, A)
    poison(X)
    (A,) = on_dev(A)
    ref = torch.linalg.inv(A.to(torch.complex128 if dt == C64 else torch.float64))
    tfn = lambda: torch.linalg.inv(A)
    return Case("linalg", f"inv batch={batch} n={n} {DT[dt]}", Replay(recording),
                compare(X, ref, dt, extra=10, torch_out=tfn if large else None), nbytes(A, X), 0,
                tfn if large else None, "torch.linalg.inv")


def qr_case(batch, m, n, dt, mode="reduced", large=False):
    A = randn(batch, m, n, dtype=dt)
    recording, (Q, _) = record(mps_ext.qr, A, mode)
    # R is made on the host from the factors geqrf writes (its second buffer, transposed, complex as
    # real pairs): the check reads that buffer.
    factors = recording.launches[0].args[1].tensor
    factors = (torch.view_as_complex(factors) if dt == C64 else factors).mT
    poison(factors)
    if Q.numel():
        poison(Q)
    (A,) = on_dev(A)
    # LAPACK's signs in double precision: the kernels promise the same Q and R.
    ref_Q, ref_R = torch.linalg.qr(A.to(torch.complex128 if dt == C64 else torch.float64), mode)
    tfn = lambda: torch.linalg.qr(A, mode)

    def check():
        ok, msg = compare(factors[:, :ref_R.shape[-2]].triu(), ref_R, dt, extra=10)()
        if not Q.numel():
            return ok, f"R {msg}"
        ok_q, msg_q = compare(Q, ref_Q, dt, extra=10)()
        return ok and ok_q, f"Q {msg_q}; R {msg}"

    return Case("linalg", f"qr batch={batch} {m}x{n} {DT[dt]} {mode}", Replay(recording), check,
                nbytes(A, factors) + nbytes(Q), 0, tfn if large else None, "torch.linalg.qr")


def trsm_case(batch, n, k, dt, upper, unit=False, large=False):
    A = well_conditioned(batch, n, dt)
    A = A.triu() if upper else A.tril()
    B = randn(batch, n, k, dtype=dt)
    recording, X = record(mps_ext.solve_triangular, A, B, upper=upper, unitriangular=unit)
    poison(X)
    A, B = on_dev(A, B)
    wide = torch.complex128 if dt == C64 else torch.float64
    ref = torch.linalg.solve_triangular(A.to(wide), B.to(wide), upper=upper, unitriangular=unit)
    tfn = lambda: torch.linalg.solve_triangular(A, B, upper=upper, unitriangular=unit)
    return Case("linalg", f"solve_triangular batch={batch} n={n} k={k} {DT[dt]} {'upper' if upper else 'lower'}"
                f"{' unit' if unit else ''}", Replay(recording), compare(X, ref, dt, extra=10, torch_out=tfn if large else None),
                nbytes(A, B, X), 0, tfn if large else None, "torch.linalg.solve_triangular")


def linalg_small():
    cases = []
    for dt in (F32, C64):
        cases += [lu_factor_case(37, 3, dt), lu_factor_case(5, 37, dt), solve_case(37, 4, 2, dt),
                  solve_case(5, 37, 3, dt), lu_solve_case(37, 3, 2, dt), lu_solve_case(37, 3, 2, dt, adjoint=True),
                  lu_solve_case(5, 40, 3, dt, adjoint=True), trsm_case(5, 37, 3, dt, upper=True),
                  trsm_case(5, 37, 3, dt, upper=False, unit=True), inv_case(37, 4, dt), inv_case(5, 37, dt),
                  qr_case(5, 40, 33, dt, "complete"), qr_case(5, 33, 40, dt), qr_case(5, 64, 64, dt, "r")]
    cases += [trsm_case(3, 32, 9, F32, upper=False), trsm_case(3, 16, 8, F32, upper=True, unit=True)]
    return cases


def linalg_large():
    return [lu_factor_case(4096, 4, F32, large=True), solve_case(4096, 4, 1, F32, large=True),
            lu_solve_case(4096, 4, 4, F32, large=True), trsm_case(4096, 4, 4, F32, upper=False, large=True),
            solve_case(4096, 4, 1, C64, large=True), lu_factor_case(4096, 32, F32, large=True),
            solve_case(4096, 32, 8, F32, large=True), trsm_case(4096, 64, 64, F32, upper=True, large=True),
            trsm_case(4096, 64, 4, C64, upper=False, large=True), inv_case(4096, 4, F32, large=True),
            inv_case(4096, 32, F32, large=True), qr_case(4096, 4, 4, F32, large=True),
            qr_case(4096, 32, 32, F32, large=True), qr_case(4096, 64, 64, C64, large=True)]


# ---------------------------------------------------------------- pad

def padded(x, pad, mode):
    """F.pad as a pipeline calls it, on the CPU with the overrides on: the pad kernels' host plan."""
    with mps_ext.overrides.enabled("cpu"):
        return F.pad(x, pad, mode=mode)


def pad_case(shape, pad, mode, dt, large=False, unaligned=False):
    # The forward moves bytes: torch's own result on the GPU, bit for bit, is the reference.
    x = randn(*shape, dtype=dt, scale=100.0)
    if unaligned:
        x = offset_view(x)
    recording, y = record(padded, x, pad, mode)
    poison(y)
    (x_dev,) = on_dev(x)
    tfn = lambda: F.pad(x_dev, pad, mode=mode)

    def check():
        same = torch.equal(y.to(DEV), tfn())
        return same, "bit for bit torch's" if same else "DIFFERS from torch's"

    name = DT.get(dt, str(dt).removeprefix("torch."))
    return Case("pad", f"pad {mode} {tuple(shape)} {pad} {name}{' unaligned' if unaligned else ''}",
                Replay(recording), check, nbytes(x, y), 0, tfn if large else None, "F.pad")


def backward_case(family, name, forward, x, dy, dt, large, note):
    """The backward of forward(x) alone: the forward runs in the simulator, only autograd's backward call is
    recorded; checked against float64 autograd of the same forward on DEV, torch's own backward beside it."""
    xg = x.clone().requires_grad_()
    with mps_ext.overrides.enabled("cpu"):
        y = forward(xg)

    def grad():
        with mps_ext.overrides.enabled("cpu"):
            return torch.autograd.grad(y, xg, dy)

    recording, (dx,) = record(grad)
    poison(dx)
    x_dev, dy_dev = on_dev(x, dy)
    wide = torch.complex128 if x.is_complex() else torch.float64
    xw = x_dev.to(wide).requires_grad_()
    (ref,) = torch.autograd.grad(forward(xw), xw, dy_dev.to(wide))
    xt = x_dev.clone().requires_grad_()
    yt = forward(xt)
    tfn = lambda: torch.autograd.grad(yt, xt, dy_dev, retain_graph=True)  # torch's backward alone, as ours
    return Case(family, f"{name} {DT[dt]}", Replay(recording),
                compare(dx, ref, dt, extra=4, torch_out=(lambda: tfn()[0]) if large else None), nbytes(dy, x), 0,
                tfn if large else None, note)


def pad_backward_case(shape, pad, mode, dt, large=False):
    dy = randn(*F.pad(torch.empty(shape, device="meta"), pad, mode=mode).shape, dtype=dt)
    return backward_case("pad", f"pad backward {mode} {tuple(shape)} {pad}", lambda x: F.pad(x, pad, mode=mode),
                         randn(*shape, dtype=dt), dy, dt, large, "F.pad backward")


def pad_small():
    cases = []
    # Every element size (the forward kernels move bytes), aligned and not.
    for dt in (torch.uint8, BF16, F32, torch.int64, torch.complex128):
        for mode in ("constant", "reflect", "replicate"):
            cases += [pad_case((2, 3, 5, 40), (16 // torch.empty(0, dtype=dt).element_size(), 3, 2, 1), mode, dt),
                      pad_case((2, 3, 7, 9), (1, 2, 3, 0), mode, dt, unaligned=True)]
    cases += [pad_case((1, 4, 3, 40, 48), (0, 0, 0, 0, 2, 0), "constant", BF16),
              pad_case((1, 4, 3, 9, 10), (1, 1, 2, 0, 0, 2), "reflect", F32)]
    for dt in (F32, F16, BF16, C64):
        for mode in ("reflect", "replicate"):
            cases += [pad_backward_case((2, 3, 9, 11), (2, 3, 1, 2), mode, dt),
                      pad_backward_case((2, 2, 4, 5, 6), (1, 2, 2, 1, 3, 0), mode, dt)]
    return cases


def pad_large():
    return [pad_case((1, 96, 17, 480, 832), (0, 0, 0, 0, 1, 0), "constant", BF16, large=True),
            pad_case((1, 96, 17, 480, 832), (1, 1, 1, 1, 2, 0), "constant", BF16, large=True),
            pad_case((1, 192, 2, 256, 256), (0, 0, 0, 0, 1, 0), "constant", F32, large=True),
            pad_case((8, 256, 128, 128), (1, 1, 1, 1), "reflect", BF16, large=True),
            pad_case((8, 256, 128, 128), (1, 1, 1, 1), "replicate", F32, large=True),
            pad_case((8, 512, 16000), (256, 256), "reflect", F32, large=True),
            pad_backward_case((8, 256, 128, 128), (1, 1, 1, 1), "reflect", BF16, large=True),
            pad_backward_case((1, 96, 17, 120, 208), (1, 1, 1, 1, 2, 0), "replicate", F32, large=True)]



# ---------------------------------------------------------------- upsample

def interpolated(x, mode, size, align_corners):
    """F.interpolate as a pipeline calls it, on the CPU with the overrides on: the upsample kernels' host plan."""
    with mps_ext.overrides.enabled("cpu"):
        return F.interpolate(x, size=size, mode=mode, align_corners=align_corners)


def upsample_case(shape, size, mode, dt, align_corners=None, channels_last=False, large=False):
    # Nearest moves elements: torch's CPU result, which the kernels index as, is the reference bit for bit.
    # Linear and cubic against float64 on DEV, torch's own beside them.
    x = randn(*shape, dtype=dt, scale=100.0 if dt == torch.uint8 else 1.0)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last if x.dim() == 4 else torch.channels_last_3d)
    recording, y = record(interpolated, x, mode, size, align_corners)
    nearest = mode.startswith("nearest")
    want = F.interpolate(x, size=size, mode=mode) if nearest else None
    poison(y)
    (x_dev,) = on_dev(x)
    tfn = lambda: F.interpolate(x_dev, size=size, mode=mode, align_corners=align_corners)
    if nearest:
        def check():
            same = torch.equal(y, want)
            return same, "bit for bit torch's CPU kernel's" if same else "DIFFERS from torch's CPU kernel's"
    else:
        ref = F.interpolate(x_dev.double(), size=size, mode=mode, align_corners=align_corners)
        check = compare(y, ref, dt, extra=4, torch_out=tfn if large else None)
    layout = " channels-last" if channels_last else ""
    corners = " align_corners" if align_corners else ""
    name = DT.get(dt, str(dt).removeprefix("torch."))
    return Case("upsample", f"upsample {mode} {tuple(shape)} to {tuple(size)} {name}{layout}{corners}",
                Replay(recording), check, nbytes(x, y), 0, tfn if large else None, "F.interpolate")


def upsample_backward_case(shape, size, mode, dt, large=False):
    return backward_case("upsample", f"upsample backward {mode} {tuple(shape)} to {tuple(size)}",
                         lambda x: F.interpolate(x, size=size, mode=mode), randn(*shape, dtype=dt),
                         randn(*shape[:2], *size, dtype=dt), dt, large, "F.interpolate backward")


def upsample_small():
    # Each kernel handles one number of interpolated dimensions; nearest moves bytes: uint8 (as images come) is
    # its one-byte kernel. Odd channel counts leave the last group of channels partial.
    shapes = {1: ((2, 3, 11), (17,)), 2: ((2, 3, 5, 7), (9, 12)), 3: ((1, 5, 3, 5, 4), (5, 9, 7))}
    smooth = {1: ("linear",), 2: ("bilinear", "bicubic"), 3: ("trilinear",)}
    cases = [upsample_case(shape, size, mode, torch.uint8)
             for shape, size in shapes.values() for mode in ("nearest", "nearest-exact")]
    for dt in (F32, F16, BF16):
        for dims, (shape, size) in shapes.items():
            cases += [upsample_case(shape, size, "nearest", dt), upsample_case(shape, size, "nearest-exact", dt)]
            cases += [upsample_case(shape, size, mode, dt, align_corners=dims == 2) for mode in smooth[dims]]
            cases += [upsample_backward_case(shape, size, mode, dt)
                      for mode in ("nearest", "nearest-exact", *smooth[dims])]
        cases += [upsample_case((2, 5, 5, 7), (10, 14), "nearest-exact", dt, channels_last=True),
                  upsample_case((1, 6, 3, 5, 4), (5, 9, 7), "trilinear", dt, channels_last=True)]
    # Each element copied 2^k times along every dimension, 16-byte runs aligned: the repeat kernels, a row doubled
    # inside each run where channels come first (the same size in 1-D: a copy), 16 channels a run channels last.
    for dt in (torch.uint8, BF16, F32):
        cases += [upsample_case((2, 3, 16), (32,), "nearest-exact", dt), upsample_case((2, 3, 16), (16,), "nearest", dt),
                  upsample_case((2, 3, 3, 16), (6, 32), "nearest", dt),
                  upsample_case((2, 16, 3, 5), (6, 10), "nearest-exact", dt, channels_last=True),
                  upsample_case((1, 3, 2, 3, 16), (4, 6, 32), "nearest-exact", dt),
                  upsample_case((1, 16, 2, 3, 3), (8, 6, 6), "nearest", dt, channels_last=True)]
    return cases


def upsample_large():
    # The 2x nearest-exact upsampling of Qwen-Image's and Wan's VAE decoders (frames as the batch), then the
    # other modes at feature-map sizes.
    return [upsample_case((1, 384, 256, 256), (512, 512), "nearest-exact", BF16, large=True),
            upsample_case((4, 256, 128, 128), (256, 256), "nearest-exact", BF16, channels_last=True, large=True),
            upsample_case((8, 256, 128, 128), (256, 256), "nearest", F32, large=True),
            upsample_case((8, 256, 128, 128), (256, 256), "bilinear", F32, align_corners=False, large=True),
            upsample_case((8, 256, 128, 128), (256, 256), "bilinear", BF16, align_corners=True, large=True),
            upsample_case((4, 64, 256, 256), (512, 512), "bicubic", F32, align_corners=False, large=True),
            upsample_case((1, 64, 16, 64, 64), (32, 128, 128), "trilinear", F32, align_corners=False, large=True),
            upsample_backward_case((1, 384, 128, 128), (256, 256), "nearest-exact", BF16, large=True),
            upsample_backward_case((8, 128, 64, 64), (128, 128), "bilinear", F32, large=True)]


# ---------------------------------------------------------------- dropout

def dropped(x, p):
    """native_dropout (F.dropout's fused path) on the CPU with the overrides on: the dropout kernel's host plan."""
    with mps_ext.overrides.enabled("cpu"):
        return torch.native_dropout(x, p, True)


def dropout_case(shape, p, dt, large=False, unaligned=False):
    # The mask is the kernel's own Philox draw for the recorded key: the simulator's replay of the same
    # recording must give it bit for bit; the output is torch's arithmetic on that mask (its rounding), and
    # the mask keeps a plausible share.
    x = randn(*shape, dtype=dt)
    if unaligned:
        x = offset_view(x)
    recording, (y, mask) = record(dropped, x, p)
    poison(y)
    poison(mask)  # all kept: a mask left unwritten keeps no plausible share
    (x_dev,) = on_dev(x)
    tfn = lambda: F.dropout(x_dev, p)

    def check():
        y_dev, mask_dev = y.to(DEV), mask.to(DEV)
        n, kept = mask.numel(), int(mask_dev.sum())
        plausible = abs(kept - n * (1 - p)) < 6 * (n * p * (1 - p)) ** 0.5
        same = torch.equal(y_dev, x_dev.mul(mask_dev).mul_(1 / (1 - p)))
        msg = f"kept {kept / n:.4f} of {1 - p:.4f}; output {'is' if same else 'is NOT'} torch's on the mask"
        if not large:  # the simulator replays the same launches: the same mask and output, bit for bit
            gpu = y.clone(), mask.clone()
            recording.replay()
            simulated = torch.equal(gpu[0], y) and torch.equal(gpu[1], mask)
            msg += "; simulator's mask" + (" and output the same" if simulated else " DIFFERS")
            same = same and simulated
        return plausible and same, msg

    name = f"dropout {tuple(shape)} p={p} {DT[dt]}{' unaligned' if unaligned else ''}"
    return Case("dropout", name, Replay(recording), check, nbytes(x, y, mask), 0, tfn if large else None,
                "F.dropout")


def dropout_backward(dy, mask, scale):
    """native_dropout_backward on the CPU with the overrides on: the dropout backward kernel's host plan."""
    with mps_ext.overrides.enabled("cpu"):
        return torch.ops.aten.native_dropout_backward(dy, mask, scale)


def dropout_backward_case(shape, scale, dt, large=False):
    dy, mask = randn(*shape, dtype=dt), randn(*shape) > 0
    recording, dx = record(dropout_backward, dy, mask, scale)
    poison(dx)
    dy_dev, mask_dev = on_dev(dy, mask)
    tfn = lambda: torch.ops.aten.native_dropout_backward(dy_dev, mask_dev, scale)

    def check():
        same = torch.equal(dx.to(DEV), dy_dev.mul(mask_dev).mul_(scale))
        return same, "bit for bit torch's" if same else "DIFFERS from torch's"

    return Case("dropout", f"dropout backward {tuple(shape)} {DT[dt]}", Replay(recording), check,
                nbytes(dy, mask, dx), 0, tfn if large else None, "native_dropout_backward")


def dropout_small():
    cases = []
    for dt in (F32, F16, BF16):
        cases += [dropout_case((37, 101), 0.3, dt), dropout_case((5, 999), 0.5, dt, unaligned=True),
                  dropout_backward_case((37, 101), 1 / 0.7, dt)]
    return cases


def dropout_large():
    # Transformer activations (batch x sequence x hidden) and a feature map.
    return [dropout_case((8, 2048, 4096), 0.1, BF16, large=True), dropout_case((8, 2048, 4096), 0.1, F32, large=True),
            dropout_case((32, 256, 64, 64), 0.5, F16, large=True),
            dropout_backward_case((8, 2048, 4096), 1 / 0.9, BF16, large=True)]


# ---------------------------------------------------------------- attention

def attended(q, k, v, mask, causal, gqa):
    """F.scaled_dot_product_attention as a model calls it, on the CPU with the overrides on: the attention
    kernels' host plan."""
    with mps_ext.overrides.enabled("cpu"):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=gqa)


def attention_case(batch, heads, kv_heads, q_len, keys, dim, dt, v_dim=None, mask=None, causal=False, large=False):
    gqa = heads != kv_heads
    q = randn(batch, heads, q_len, dim, dtype=dt)
    k, v = randn(batch, kv_heads, keys, dim, dtype=dt), randn(batch, kv_heads, keys, v_dim or dim, dtype=dt)
    m = None if mask is None else (randn(1, 1, q_len, keys) > -1 if mask == "bool" else randn(1, 1, q_len, keys, dtype=mask))
    recording, y = record(attended, q, k, v, m, causal, gqa)
    poison(y)
    q_dev, k_dev, v_dev = on_dev(q, k, v)
    m_dev = None if m is None else on_dev(m)[0]
    tfn = lambda: F.scaled_dot_product_attention(q_dev, k_dev, v_dev, attn_mask=m_dev, is_causal=causal,
                                                 enable_gqa=gqa)
    wide = None if m_dev is None or m_dev.dtype == torch.bool else m_dev.double()
    ref = F.scaled_dot_product_attention(q_dev.double(), k_dev.double(), v_dev.double(),
                                         attn_mask=m_dev if wide is None else wide, is_causal=causal, enable_gqa=gqa)
    masked = "" if mask is None else f" {DT.get(mask, mask)} mask"
    name = (f"attention {batch}x{heads}/{kv_heads} heads q {q_len} keys {keys} d {dim}"
            f"{'/' + str(v_dim) if v_dim else ''} {DT[dt]}{masked}{' causal' if causal else ''}")
    return Case("attention", name, Replay(recording), compare(y, ref, dt, extra=4, torch_out=tfn if large else None),
                nbytes(q, k, v, y), 0, tfn if large else None, "F.scaled_dot_product_attention")


def attention_backward_case(heads, kv_heads, q_len, keys, dim, dt, causal=False, large=False):
    # The training kernels' backward alone: the forward (saving the log-sum-exp) runs in the simulator, only
    # autograd's backward call is recorded; dq, dk, dv against float64 autograd on DEV.
    q, k, v = randn(1, heads, q_len, dim, dtype=dt), randn(1, kv_heads, keys, dim, dtype=dt), \
        randn(1, kv_heads, keys, dim, dtype=dt)
    dy = randn(1, heads, q_len, dim, dtype=dt)
    gqa = heads != kv_heads
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    with mps_ext.overrides.enabled("cpu"):
        y = F.scaled_dot_product_attention(*leaves, is_causal=causal, enable_gqa=gqa)

    def grad():
        with mps_ext.overrides.enabled("cpu"):
            return torch.autograd.grad(y, leaves, dy)

    recording, grads = record(grad)
    for g in grads:
        poison(g)
    wide = [t.double().requires_grad_() for t in on_dev(q, k, v)]
    (dy_dev,) = on_dev(dy)
    refs = torch.autograd.grad(F.scaled_dot_product_attention(*wide, is_causal=causal, enable_gqa=gqa), wide,
                               dy_dev.double())
    ref = torch.cat([r.flatten() for r in refs])
    xt = [t.clone().requires_grad_() for t in on_dev(q, k, v)]
    yt = F.scaled_dot_product_attention(*xt, is_causal=causal, enable_gqa=gqa)
    tfn = lambda: torch.autograd.grad(yt, xt, dy_dev, retain_graph=True)  # torch's backward alone, as ours
    flat = lambda gs: torch.cat([g.to(DEV).flatten() for g in gs])
    check = lambda: compare(flat(grads), ref, dt, extra=8, torch_out=(lambda: flat(tfn())) if large else None)()
    name = f"attention backward {heads}/{kv_heads} heads q {q_len} keys {keys} d {dim} {DT[dt]}{' causal' if causal else ''}"
    return Case("attention", name, Replay(recording), check, nbytes(q, k, v, dy, *grads), 0, tfn if large else None,
                "F.scaled_dot_product_attention backward")


def attention_small():
    # Every kernel: each dtype, head-dim slice (2, 4, 6, 8 elements per lane) and row block (query heads per KV
    # head x query rows: 1, 2, 4, 8), the 8-row blocks with keys split and merged; masks vary with the block.
    cases = []
    for dt in (F32, F16, BF16):
        for dim, v_dim in ((40, None), (80, None), (192, 128), (256, None)):
            cases += [attention_case(1, 2, 2, 1, 37, dim, dt, v_dim=v_dim),
                      attention_case(2, 4, 2, 1, 37, dim, dt, v_dim=v_dim, mask="bool"),
                      attention_case(1, 4, 2, 2, 37, dim, dt, v_dim=v_dim, mask=F32),
                      attention_case(1, 8, 2, 2, 150, dim, dt, v_dim=v_dim, mask=dt if v_dim else None,
                                     causal=v_dim is None)]
        # Prefill: every padded head dim D (32 to 256), a block of 32 rows and a bit, causal or masked in turn.
        for i, (dim, v_dim) in enumerate(((24, 32), (64, None), (80, 72), (128, None), (160, None), (192, 128),
                                          (256, None))):
            cases.append(attention_case(1, 4, 2, 37, 45, dim, dt, v_dim=v_dim, mask=(None, "bool", F32)[i % 3],
                                        causal=i % 3 == 0))
        # Training: every backward head dim D (32 to 128), GQA, causal in turn.
        cases += [attention_backward_case(4, 2, 37, 45, dim, dt, causal=i % 2 == 0)
                  for i, dim in enumerate((24, 64, 80, 128))]
    return cases


def attention_large():
    # Llama-3-8B decode: 32 query heads over 8 KV heads, d 128, bf16.
    return [attention_case(1, 32, 8, 1, 4096, 128, BF16, large=True),
            attention_case(1, 32, 8, 1, 32768, 128, BF16, large=True),
            attention_case(1, 32, 8, 4, 4096, 128, BF16, large=True),
            attention_case(1, 32, 8, 1024, 1024, 128, BF16, causal=True, large=True),
            attention_backward_case(32, 8, 256, 256, 128, BF16, causal=True, large=True)]  # its forward simulated


SMALL = {"softmax": softmax_small, "gemv": gemv_small, "fp8": fp8_small, "grouped_mm": grouped_small,
         "linalg": linalg_small, "pad": pad_small, "upsample": upsample_small,
         "dropout": dropout_small, "attention": attention_small}
LARGE = {"softmax": softmax_large, "gemv": gemv_large, "fp8": fp8_large, "grouped_mm": grouped_large,
         "linalg": linalg_large, "pad": pad_large, "upsample": upsample_large,
         "dropout": dropout_large, "attention": attention_large}
