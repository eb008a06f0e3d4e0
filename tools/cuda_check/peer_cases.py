"""The cases of tools/cuda_check/peers.py (benchmarks/_decode_cases.py, _media_cases.py and _attention_cases.py,
the lists the Mac benchmarks time too) and, for each, its implementations: ours (our host's plan), the peers' (peer_plans.py), torch CUDA's, each
with its inputs, a float64 reference and the bytes it must move.

Inputs rotate: an implementation holds several input sets, enough to exceed ROTATE_BYTES (4x an H200's L2),
so a timed call reads its weights from memory, not from the cache of the call before.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Callable

import torch
import torch.nn.functional as F

import mps_ext
import peer_plans
import peer_torch
import cuda
import replay
from translate_cuda import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import _attention_cases  # noqa: E402
import _decode_cases  # noqa: E402
import _media_cases  # noqa: E402
from _decode_cases import BF16, F32, Case  # noqa: E402
from cases import dropout_backward, dropped, interpolated, padded  # noqa: E402 (those families' host plans)

ROTATE_BYTES, MAX_SETS = 256 << 20, 16


def cases() -> list[Case]:
    """docs/performance.md's cases, in its tables' order."""
    return _decode_cases.cases() + _media_cases.cases() + _attention_cases.cases()


def our_plan(op: Callable, *args):
    """(launches, output) of the mps_ext op `op` on args (tensors on cuda.DEV): the one place this tool takes
    our plans from. The op's own host plan (csrc/ops) is recorded on CPU tensors of args' sizes and strides
    (their values unread: no plan reads data on the host) and replayed bound to args themselves."""
    shadows = [torch.empty_strided(a.size(), a.stride(), dtype=a.dtype) if isinstance(a, torch.Tensor) else a
               for a in args]
    recording, out = replay.record(op, *shadows)
    bound = replay.Replay(recording, {s: a for s, a in zip(shadows, args) if isinstance(a, torch.Tensor)})
    return bound.launches, tuple(map(bound.on_device, out)) if isinstance(out, tuple) else bound.on_device(out)


@dataclasses.dataclass
class Impl:
    """One implementation of a case. runs: per input set, the launches of a kernel or a function (torch's);
    output(): set 0's output after its run, in the reference's row order; poison: what output() reads,
    filled with NaN before the check so that an unwritten element fails it."""

    name: str
    runs: list
    output: Callable[[], torch.Tensor]
    ref: torch.Tensor
    dtype: torch.dtype
    bytes: int
    note: str = ""
    poison: list = dataclasses.field(default_factory=list)
    not_applicable: str = ""  # why this implementation cannot express the case (nothing runs)


def not_applicable(name: str, why: str) -> Impl:
    """A peer that cannot express a case: reported as such, never timed."""
    return Impl(name, [], lambda: None, None, None, 0, not_applicable=why)


def peer(name: str, build: Callable[[], Impl]) -> Impl:
    """A peer's implementation, or, where its own host code refuses the case (ggml's plans assert on shapes
    its host would not build), that cell alone not applicable, saying why: the case's other cells still run."""
    try:
        return build()
    except (AssertionError, ValueError, KeyError, NotImplementedError) as e:
        return not_applicable(name, f"its plan refuses the case: {type(e).__name__}: {e}")


def kernel_impl(name, planned: list[tuple], ref, nbytes, note="", order=None) -> Impl:
    """From (launches, output) per input set; order: the reference's row of each output row."""
    out = planned[0][1]
    output = (lambda: out) if order is None else (lambda: torch.empty_like(out).index_copy_(0, order, out))
    return Impl(name, [launches for launches, _ in planned], output, ref, out.dtype, nbytes, note, [out])


def torch_impl(fns: list[Callable], ref, dtype, nbytes, note, order=None) -> Impl:
    """From torch's op per input set (functions returning the output)."""
    last = {}

    def run(s):
        def call():
            last[s] = fns[s]()
        return call

    def output():
        out = last[0]
        return out if order is None else torch.empty_like(out).index_copy_(0, order, out)
    return Impl("torch", [run(s) for s in range(len(fns))], output, ref, dtype, nbytes, note)


def randn(*shape, dtype=F32, scale=1.0) -> torch.Tensor:
    """Normal values times scale, rounded to dtype, where the tool's buffers live."""
    return (torch.randn(*shape, device=cuda.DEV) * scale).to(dtype)


def input_sets(bytes_per_call: int, rotate: int) -> range:
    """As many input sets as exceed `rotate` bytes together (at most MAX_SETS)."""
    return range(max(1, min(MAX_SETS, -(-rotate // bytes_per_call))))


def gemv(case: Case, ggml: peer_plans.Ggml, rotate: int) -> list[Impl]:
    """x (m, k) @ W.T, W (n, k) row-major: F.linear without bias."""
    (n, k, m), dtype = case.dims, case.dtype
    sets = input_sets(n * k * 2, rotate)
    W = [randn(n, k, dtype=dtype, scale=0.02) for _ in sets]
    X = [randn(m, k, dtype=dtype) for _ in sets]
    X32 = [x.float() for x in X]
    ref = X[0].double() @ W[0].double().T
    nbytes = (n * k + m * k + m * n) * 2
    Y32 = [torch.empty(m, n, device=cuda.DEV) for _ in sets]
    Ym = [torch.empty(m, n, device=cuda.DEV, dtype=dtype) for _ in sets]
    return [kernel_impl("ours", [our_plan(mps_ext.linear, X[s], W[s]) for s in sets], ref, nbytes),
            peer("ggml", lambda: kernel_impl("ggml", [(ggml.gemv(W[s], X32[s], Y32[s]), Y32[s]) for s in sets], ref,
                                             n * k * 2 + (m * k + m * n) * 4, "f32 activations and output")),
            peer("mlx", lambda: kernel_impl("mlx", [(peer_plans.mlx_gemv(W[s], X[s], Ym[s]), Ym[s]) for s in sets],
                                            ref, nbytes, "gemv" if m == 1 else "gemv_wide (2-5 rows on M3 and later)")),
            torch_impl([lambda s=s: F.linear(X[s], W[s]) for s in sets], ref, dtype, nbytes, "F.linear"),
            peer(peer_torch.NAME, lambda: torch_mps_gemv(W, X, sets, ref, nbytes))]


def torch_mps_gemv(W, X, sets, ref, nbytes) -> Impl:
    """torch 2.15's gemv_nt for one row (its few-row kernels take e4m3fn activations only)."""
    if X[0].shape[0] != 1:
        return not_applicable(peer_torch.NAME, peer_torch.NOT_ON_PROXY["gemv_rows"])
    if peer_torch.SOURCES is None:
        return not_applicable(peer_torch.NAME, peer_torch.NO_SOURCES)
    Y = [torch.empty(1, W[0].shape[0], dtype=W[0].dtype, device=cuda.DEV) for _ in sets]
    nsimd, vec = peer_torch.gemv_config(W[0].dtype, *W[0].shape)
    return kernel_impl(peer_torch.NAME, [(peer_torch.gemv(W[s], X[s], Y[s]), Y[s]) for s in sets], ref, nbytes,
                       f"gemv_nt, {nsimd} SIMD groups, {vec}-element loads")


def fp8(case: Case, ggml: peer_plans.Ggml, rotate: int) -> list[Impl]:
    """fp8_linear (bf16 activations, e4m3fn weights with one scale per row, as FP8 checkpoints converted per
    channel) beside our bf16 GEMV and torch's on the same weights dequantized."""
    n, k, m = case.dims
    sets = input_sets(n * k, rotate)
    W8 = [randn(n, k, scale=64).clamp(-448, 448).to(torch.float8_e4m3fn) for _ in sets]
    S = [torch.rand(n, device=cuda.DEV) * 0.01 + 0.001 for _ in sets]
    Wd = [(w.float() * sc[:, None]).to(BF16) for w, sc in zip(W8, S)]
    X = [randn(m, k, dtype=BF16) for _ in sets]
    ref = X[0].double() @ (W8[0].double() * S[0].double()[:, None]).T
    bf16_bytes = (n * k + m * k + m * n) * 2
    return [kernel_impl("ours", [our_plan(mps_ext.fp8_linear, X[s], W8[s], S[s]) for s in sets], ref,
                        n * k + n * 4 + (m * k + m * n) * 2, "fp8_linear, per-row scales"),
            kernel_impl("bf16", [our_plan(mps_ext.linear, X[s], Wd[s]) for s in sets], ref, bf16_bytes,
                        "our bf16 GEMV on the dequantized weights"),
            torch_impl([lambda s=s: F.linear(X[s], Wd[s]) for s in sets], ref, BF16, bf16_bytes,
                       "F.linear on the dequantized weights"),
            not_applicable(peer_torch.NAME, peer_torch.NOT_ON_PROXY["fp8"])]


ROUTINGS = 8  # MoE: the expert weights stay; what rotates is the routing and the activations


def routing(e: int, topk: int, tokens: int, seed: int) -> torch.Tensor:
    """(tokens, topk) distinct experts per token, int32."""
    gen = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(e, generator=gen)[:topk] for _ in range(tokens)]).to(torch.int32).to(cuda.DEV)


def distinct_experts(ids: list[torch.Tensor]) -> float:
    """The experts a routing reads, on average over the routings a case rotates through: each call of the timed
    replay reads its own routing's experts once, so the bytes that the median time moves are these."""
    return sum(int(torch.unique(i).numel()) for i in ids) / len(ids)


def sorted_rows(ids: torch.Tensor, e: int):
    """The order that sorts routed rows by expert (stable), and offs (cumulative rows per expert)."""
    flat = ids.reshape(-1).long()
    return torch.argsort(flat, stable=True), torch.cumsum(torch.bincount(flat, minlength=e), 0).to(torch.int32)


def moe(case: Case, ggml: peer_plans.Ggml, rotate: int) -> list[Impl]:
    """Ours and torch's on rows sorted by expert (as transformers calls torch._grouped_mm); ggml's mul_mv_id
    and MLX's gemv_gather on the routing as it comes. gate_up reads each token's row top-k times, down one
    row per (token, expert)."""
    (e, topk, op, n, k, tokens), dtype = case.dims, case.dtype
    rows = tokens * topk
    W = randn(e, n, k, dtype=dtype, scale=0.02)
    ids = [routing(e, topk, tokens, seed=1234 + tokens + n + s) for s in range(ROUTINGS)]
    inputs = [randn(tokens, *(() if op == "gate_up" else (topk,)), k, dtype=dtype) for _ in ids]
    token_of_row = torch.arange(tokens, device=cuda.DEV).repeat_interleave(topk)
    routed = [x[token_of_row] if op == "gate_up" else x.reshape(rows, k) for x in inputs]  # (token, j) order
    ref = torch.einsum("pnk,pk->pn", W[ids[0].reshape(-1).long()].double(), routed[0].double())
    weights = round(distinct_experts(ids) * n * k * 2)
    nbytes = weights + rows * (k + n) * 2
    order, offs = zip(*(sorted_rows(i, e) for i in ids))
    A = [r[o].contiguous() for r, o in zip(routed, order)]
    x32 = [x.float().reshape(tokens, -1, k) for x in inputs]
    Yg = [torch.empty(tokens, topk, n, device=cuda.DEV) for _ in ids]
    Ym = [torch.empty(rows, n, device=cuda.DEV, dtype=dtype) for _ in ids]
    vectors = inputs if op == "gate_up" else routed
    vector_ids = (token_of_row if op == "gate_up" else torch.arange(rows, device=cuda.DEV)).to(torch.int32)
    return [kernel_impl("ours", [our_plan(mps_ext.grouped_mm, A[s], W.transpose(-2, -1), offs[s]) for s in range(ROUTINGS)],
                        ref, nbytes, "grouped_mm decode, rows sorted by expert", order[0]),
            peer("ggml", lambda: kernel_impl(
                "ggml", [(ggml.moe(W, x32[s], ids[s], Yg[s]), Yg[s].view(rows, n)) for s in range(ROUTINGS)], ref,
                weights + x32[0].numel() * 4 + rows * n * 4, "mul_mv_id; f32 activations and output")),
            peer("mlx", lambda: kernel_impl(
                "mlx", [(peer_plans.mlx_gather(W, vectors[s], vector_ids, ids[s].reshape(-1), Ym[s]), Ym[s])
                        for s in range(ROUTINGS)], ref, weights + (vectors[0].numel() + rows * n) * 2, "gemv_gather")),
            torch_impl([lambda s=s: torch._grouped_mm(A[s], W.transpose(-2, -1), offs=offs[s])
                        for s in range(ROUTINGS)], ref, dtype, nbytes, "torch._grouped_mm", order[0]),
            not_applicable(peer_torch.NAME, peer_torch.NOT_ON_PROXY["moe"])]


def moe_fp8(case: Case, ggml: peer_plans.Ggml, rotate: int) -> list[Impl]:
    """fp8_grouped_mm on the experts in e4m3fn with one scale per row, beside our bf16 decode of the same
    experts, on the same routing (rows sorted by expert)."""
    e, topk, op, n, k, tokens = case.dims
    rows = tokens * topk
    W = randn(e, n, k, dtype=BF16, scale=0.02)
    scale = (W.float().abs().amax(-1) / 448).clamp_min(1e-12)
    W8 = (W.float() / scale[..., None]).to(torch.float8_e4m3fn)
    ids = [routing(e, topk, tokens, seed=1234 + tokens + n + s) for s in range(ROUTINGS)]
    order, offs = zip(*(sorted_rows(i, e) for i in ids))
    A = [randn(rows, k, dtype=BF16) for _ in ids]  # already in expert order
    experts = ids[0].reshape(-1).long()[order[0]]
    ref = torch.einsum("pnk,pk->pn", W[experts].double(), A[0].double())
    ref8 = torch.einsum("pnk,pk->pn", (W8.double() * scale.double()[..., None])[experts], A[0].double())
    distinct = distinct_experts(ids)
    return [kernel_impl("ours", [our_plan(mps_ext.fp8_grouped_mm, A[s], W8, scale, offs[s]) for s in range(ROUTINGS)],
                        ref8, round(distinct * n * k) + rows * (k + n) * 2, "fp8_grouped_mm, per-row scales"),
            kernel_impl("bf16", [our_plan(mps_ext.grouped_mm, A[s], W.transpose(-2, -1), offs[s]) for s in range(ROUTINGS)],
                        ref, round(distinct * n * k * 2) + rows * (k + n) * 2, "grouped_mm on the bf16 experts")]


def moe_kn(case: Case, ggml: peer_plans.Ggml, rotate: int) -> list[Impl]:
    """Experts stored (E, K, N), passed to torch._grouped_mm as they are (transformers' gpt-oss). No peer
    runs this layout: llama.cpp converts the experts to (E, N, K) when it writes a GGUF."""
    e, topk, op, n, k, tokens = case.dims
    rows = tokens * topk
    W = randn(e, k, n, dtype=BF16, scale=0.02)
    ids = [routing(e, topk, tokens, seed=4321 + tokens + n + s) for s in range(ROUTINGS)]
    order, offs = zip(*(sorted_rows(i, e) for i in ids))
    A = [randn(rows, k, dtype=BF16) for _ in ids]
    experts = ids[0].reshape(-1).long()[order[0]]
    ref = torch.einsum("pkn,pk->pn", W[experts].double(), A[0].double())
    nbytes = round(distinct_experts(ids) * n * k * 2) + rows * (k + n) * 2
    return [kernel_impl("ours", [our_plan(mps_ext.grouped_mm, A[s], W, offs[s]) for s in range(ROUTINGS)], ref, nbytes,
                        "grouped_mm decode along N"),
            torch_impl([lambda s=s: torch._grouped_mm(A[s], W, offs=offs[s]) for s in range(ROUTINGS)], ref, BF16,
                       nbytes, "torch._grouped_mm")]


def softmax(case: Case, ggml: peer_plans.Ggml, rotate: int) -> list[Impl]:
    """Softmax over the last dimension of a contiguous (rows, cols)."""
    (rows, cols), dtype = case.dims, case.dtype
    nbytes = 2 * rows * cols * dtype.itemsize
    sets = input_sets(nbytes // 2, rotate)
    X = [randn(rows, cols, dtype=dtype, scale=3.0) for _ in sets]
    ref = torch.softmax(X[0].double(), -1)
    Y = [torch.empty_like(x) for x in X]
    impls = [kernel_impl("ours", [our_plan(mps_ext.softmax, X[s], -1) for s in sets], ref, nbytes)]
    if dtype == F32:  # ggml's softmax takes float32 only
        Yg = [torch.empty_like(x) for x in X]
        impls.append(peer("ggml", lambda: kernel_impl("ggml", [(ggml.softmax(X[s], Yg[s]), Yg[s]) for s in sets], ref,
                                                      nbytes)))
    impls.append(peer("mlx", lambda: kernel_impl("mlx", [(peer_plans.mlx_softmax(X[s], Y[s]), Y[s]) for s in sets],
                                                 ref, nbytes, "" if dtype == F32 else "precise (float accumulation)")))
    impls.append(peer(peer_torch.NAME, lambda: torch_mps_softmax(X, sets, ref, nbytes)))
    impls.append(torch_impl([lambda s=s: torch.softmax(X[s], -1) for s in sets], ref, dtype, nbytes,
                            "torch.softmax"))
    return impls


def torch_mps_softmax(X, sets, ref, nbytes) -> Impl:
    """torch 2.15's own softmax kernels, as its host routes the shape (peer_torch.softmax_route)."""
    if peer_torch.SOURCES is None:
        return not_applicable(peer_torch.NAME, peer_torch.NO_SOURCES)
    Y = [torch.empty_like(x) for x in X]
    planned = [(peer_torch.softmax(X[s], Y[s], peer_torch.softmax_partials_buffer(X[s])), Y[s]) for s in sets]
    return kernel_impl(peer_torch.NAME, planned, ref, nbytes, peer_torch.softmax_note(*X[0].shape))


def moved(*ts) -> int:
    """The bytes of tensors read or written once."""
    return sum(t.numel() * t.element_size() for t in ts)


def pad(case: Case, ggml: peer_plans.Ggml, rotate: int) -> list[Impl]:
    """F.pad of a contiguous tensor: the input read once, the output written once."""
    (shape, widths, mode), dtype = case.dims, case.dtype
    x = randn(*shape, dtype=dtype)
    planned = our_plan(padded, x, widths, mode)
    ref = F.pad(x.double(), widths, mode=mode)
    nbytes = moved(x, planned[1])
    return [kernel_impl("ours", [planned], ref, nbytes),
            torch_impl([lambda: F.pad(x, widths, mode=mode)], ref, dtype, nbytes, "F.pad")]


def upsample(case: Case, ggml: peer_plans.Ggml, rotate: int) -> list[Impl]:
    """F.interpolate to a size (align_corners=False for the linear and cubic modes, as pipelines call it)."""
    (shape, size, mode, channels_last), dtype = case.dims, case.dtype
    x = randn(*shape, dtype=dtype)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    corners = None if mode.startswith("nearest") else False
    planned = our_plan(interpolated, x, mode, size, corners)
    ref = F.interpolate(x.double(), size=size, mode=mode, align_corners=corners)
    nbytes = moved(x, planned[1])
    return [kernel_impl("ours", [planned], ref, nbytes, "NHWC" if channels_last else ""),
            torch_impl([lambda: F.interpolate(x, size=size, mode=mode, align_corners=corners)], ref, dtype, nbytes,
                       "F.interpolate")]


def dropout(case: Case, ggml: peer_plans.Ggml, rotate: int) -> list[Impl]:
    """native_dropout (F.dropout's path: the input read, the output and the bool mask written) or its
    backward (the gradient and the mask read, the gradient written). Ours and torch's draw different masks,
    so each is checked on its own: the output is the input scaled where the mask keeps, and the mask keeps a
    plausible share (a NaN reference fails the check where it does not)."""
    (shape, p, call), dtype = case.dims, case.dtype
    x, keep = randn(*shape, dtype=dtype), torch.rand(*shape, device=cuda.DEV) >= p
    nbytes = x.numel() * (2 * x.element_size() + 1)
    ref = torch.empty(shape, dtype=torch.float64, device=cuda.DEV)
    if call == "backward":
        ref.copy_(torch.where(keep, x.double() / (1 - p), 0))
        return [kernel_impl("ours", [our_plan(dropout_backward, x, keep, 1 / (1 - p))], ref, nbytes),
                torch_impl([lambda: torch.ops.aten.native_dropout_backward(x, keep, 1 / (1 - p))], ref, dtype,
                           nbytes, "native_dropout_backward")]

    def checked(y, mask):
        n, kept = mask.numel(), int(mask.sum())
        ref.copy_(torch.where(mask, x.double() / (1 - p), 0))
        if abs(kept - n * (1 - p)) > 6 * (n * p * (1 - p)) ** 0.5:
            ref.fill_(float("nan"))
        return y

    launches, (y, mask) = our_plan(dropped, x, p)
    last = {}
    ours = Impl("ours", [launches], lambda: checked(y, mask), ref, dtype, nbytes, poison=[y])
    theirs = Impl("torch", [lambda: last.update(out=torch.native_dropout(x, p, True))],
                  lambda: checked(*last["out"]), ref, dtype, nbytes, "torch.native_dropout")
    return [ours, theirs]


def attention_reference(q, k, v, sinks, causal: bool) -> torch.Tensor:
    """float64 attention of (B, H, L, D) q over (B, KV, S, D) k, v (GQA: query head h reads KV head h // (H /
    KV)), causal with torch's top-left alignment, sinks (gpt-oss's: one logit per query head, a key of value 0);
    eight query heads at a time, so that a long prefill's scores fit."""
    heads, rows, keys = q.shape[1], q.shape[2], k.shape[2]
    group = heads // k.shape[1]
    out = torch.empty(*q.shape[:3], v.shape[-1], dtype=torch.float64, device=q.device)
    for h0 in range(0, heads, 8):
        hs = slice(h0, min(h0 + 8, heads))
        kv = torch.arange(hs.start, hs.stop, device=q.device) // group
        scores = q[:, hs].double() @ k[:, kv].double().transpose(-2, -1) * q.shape[-1] ** -0.5
        if causal:
            scores.masked_fill_(torch.ones(rows, keys, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
        if sinks is not None:
            column = sinks[hs].double().view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
            scores = torch.cat([scores, column], -1)
        out[:, hs] = torch.softmax(scores, -1)[..., :keys] @ v[:, kv].double()
    return out


def attended(q, k, v, sinks, causal):
    """The mps_ext op as transformers calls it (sinks: gpt-oss's)."""
    return mps_ext.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=q.size(1) != k.size(1),
                                                sinks=sinks)


def torch_attention(q, k, v, causal):
    """torch's F.scaled_dot_product_attention on its flash kernel (memory-efficient where the value head dim
    differs, which flash does not take); on the CPU (tests) whichever backend torch picks."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    gqa = q.size(1) != k.size(1)
    if not q.is_cuda:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
    backend = SDPBackend.FLASH_ATTENTION if q.size(-1) == v.size(-1) else SDPBackend.EFFICIENT_ATTENTION
    with sdpa_kernel([backend]):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)


def causal_mask16(rows: int, keys: int) -> torch.Tensor:
    """llama.cpp's KQ mask for causal attention: float16, 0 where a row attends a key, -inf past it."""
    mask = torch.zeros(rows, keys, dtype=torch.float16, device=cuda.DEV)
    return mask.masked_fill_(torch.ones(rows, keys, dtype=torch.bool, device=cuda.DEV).triu(1), float("-inf"))


def attention(case: Case, ggml: peer_plans.Ggml, rotate: int) -> list[Impl]:
    """Scaled dot-product attention, bf16: decode (1 or 4 query rows over a KV cache) or causal prefill; GQA
    where the KV heads are fewer; gpt-oss's sinks. Bytes: q, k, v and the output once."""
    heads, kv_heads, dim, v_dim, sinks, b, q_len, keys, causal = case.dims
    dtype = case.dtype
    kv_bytes = b * kv_heads * keys * (dim + v_dim) * dtype.itemsize
    sets = input_sets(kv_bytes + b * heads * q_len * dim * dtype.itemsize, rotate)
    Q = [randn(b, heads, q_len, dim, dtype=dtype) for _ in sets]
    K = [randn(b, kv_heads, keys, dim, dtype=dtype) for _ in sets]
    V = [randn(b, kv_heads, keys, v_dim, dtype=dtype) for _ in sets]
    S32 = randn(heads, scale=2.0, dtype=dtype).float() if sinks else None  # the same values for every peer
    ref = attention_reference(Q[0], K[0], V[0], S32, causal)
    out_bytes = b * heads * q_len * v_dim * dtype.itemsize
    nbytes = kv_bytes + Q[0].numel() * dtype.itemsize + out_bytes
    impls = [kernel_impl("ours", [our_plan(attended, Q[s], K[s], V[s], S32, causal) for s in sets], ref, nbytes,
                         "decode" if q_len <= 8 else "prefill")]
    impls.append(peer("ggml", lambda: ggml_attention(ggml, Q, K, V, S32, causal, ref,
                                                     nbytes + (Q[0].numel() + ref.numel()) * 2)))
    impls.append(peer("mlx", lambda: mlx_attention(Q, K, V, S32, ref, nbytes)))
    impls.append(peer(peer_torch.NAME, lambda: torch_mps_attention(Q, K, V, sinks, causal, ref, nbytes)))
    if sinks:
        impls.append(not_applicable("torch", "F.scaled_dot_product_attention has no sinks"))
    else:
        note = "flash" if dim == v_dim else "memory-efficient (flash needs equal head dims)"
        impls.append(torch_impl([lambda s=s: torch_attention(Q[s], K[s], V[s], causal) for s in sets], ref, dtype,
                                nbytes, f"F.scaled_dot_product_attention, {note}"))
    return impls


def torch_mps_attention(Q, K, V, sinks: bool, causal: bool, ref, nbytes) -> Impl:
    """torch 2.15's own attention kernels, as _scaled_dot_product_attention_math_mps routes the call."""
    (b, heads, q_len, dim), (kv_heads, keys), v_dim = Q[0].shape, K[0].shape[1:3], V[0].shape[-1]
    route = peer_torch.attention_route(heads, kv_heads, dim, v_dim, q_len, keys, sinks)
    if route[0] == "general":
        return not_applicable(peer_torch.NAME, route[1])
    if peer_torch.SOURCES is None:
        return not_applicable(peer_torch.NAME, peer_torch.NO_SOURCES)
    O = [torch.empty(b, heads, q_len, v_dim, dtype=Q[0].dtype, device=cuda.DEV) for _ in Q]
    runs = [(peer_torch.attention(Q[s], K[s], V[s], O[s], causal, peer_torch.attention_scratch(Q[s], keys)), O[s])
            for s in range(len(Q))]
    return kernel_impl(peer_torch.NAME, runs, ref, nbytes, peer_torch.attention_note(route))


def ggml_attention(ggml, Q, K, V, S32, causal, ref, nbytes) -> Impl:
    """ggml's flash_attn_ext (vec below 20 query rows): float32 queries and output, the output in ggml's (B, L,
    H, V) order; causality as llama.cpp gives it, a float16 mask."""
    (b, heads, q_len, dim), v_dim, keys = Q[0].shape, V[0].shape[-1], K[0].shape[2]
    why = peer_plans.ggml_attention_unsupported(dim, v_dim, q_len)
    if why:
        return not_applicable("ggml", why)
    mask = causal_mask16(q_len, keys) if causal else None
    Q32 = [q.float() for q in Q]
    O = [torch.empty(b, q_len, heads, v_dim, device=cuda.DEV) for _ in Q]
    scratch = [torch.empty(ggml.scratch_bytes(b, heads, q_len, keys, dim, v_dim), dtype=torch.uint8, device=cuda.DEV)
               for _ in Q]
    runs = [ggml.flash_attn(Q32[s], K[s], V[s], O[s], S32, mask, scratch[s]) for s in range(len(Q))]
    note = ("flash_attn_ext_vec" if peer_plans.ggml_fa_use_vec(dim, q_len) else "flash_attn_ext, a causal f16 mask") \
        + "; f32 queries and output"
    return Impl("ggml", runs, lambda: O[0].transpose(1, 2), ref, BF16, nbytes, note, [O[0]])


def mlx_attention(Q, K, V, S32, ref, nbytes) -> Impl:
    """MLX's sdpa_vector (1- or 2-pass, as its host routes) or steel_attention (prefill, the output in MLX's (B,
    L, H, V) layout)."""
    (b, heads, q_len, dim), (kv_heads, keys), v_dim = Q[0].shape, K[0].shape[1:3], V[0].shape[-1]
    route = peer_plans.mlx_attention_route(heads, kv_heads, dim, v_dim, q_len, keys)
    if route[0] not in peer_plans.MLX_TRANSLATED:
        return not_applicable("mlx", route[1] if route[0] == "unfused" else peer_plans.MLX_TRANSLATED_NOT[route[0]])
    sinks = S32.to(Q[0].dtype) if S32 is not None else None  # MLX takes the sinks in q's dtype
    if route[0] == "steel":
        O = [torch.empty(b, q_len, heads, v_dim, dtype=Q[0].dtype, device=cuda.DEV).transpose(1, 2) for _ in Q]
    else:
        O = [torch.empty(b, heads, q_len, v_dim, dtype=Q[0].dtype, device=cuda.DEV) for _ in Q]
    scratch = peer_plans.mlx_scratch(Q[0], v_dim, route[1], len(Q)) if route[0] == "2pass" else [None] * len(Q)
    runs = [peer_plans.mlx_attention(Q[s], K[s], V[s], O[s], sinks, scratch[s]) for s in range(len(Q))]
    note = {"vector": "sdpa_vector (1 pass)", "steel": "steel_attention"}.get(
        route[0], f"sdpa_vector_2pass, {route[-1]} blocks")
    return Impl("mlx", runs, lambda: O[0], ref, Q[0].dtype, nbytes, note, [O[0]])


IMPLEMENTATIONS = {"gemv": gemv, "fp8": fp8, "moe": moe, "moe_fp8": moe_fp8, "moe_kn": moe_kn, "softmax": softmax,
                   "pad": pad, "upsample": upsample, "dropout": dropout, "attention": attention}


def implementations(case: Case, ggml: peer_plans.Ggml, rotate: int = ROTATE_BYTES) -> list[Impl]:
    """Every implementation of a case, on fresh inputs."""
    return IMPLEMENTATIONS[case.family](case, ggml, rotate)
