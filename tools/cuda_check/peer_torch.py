"""torch's own Metal kernels (pytorch/pytorch aten/src/ATen/native/mps/kernels, the release's sources) as a
peer of the CUDA check ("torch-mps"), beside ggml-metal's and MLX's: their sources read at run time from a
directory (--torch-mps DIR, laid out as pytorch's tree: DIR/c10/metal/*.h, DIR/aten/src/ATen/native/mps/
kernels/*), never copied into this repository; each family's routing mirrors torch's host code
(operations/*.mm), named at each function.

    python3 tools/cuda_check/peer_torch.py extract --git-dir PYTORCH.git --rev v2.15.0 DIR   # or --tree CHECKOUT
"""

from __future__ import annotations

import argparse
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import torch

import cuda
import peer_sources
import _attention_cases  # noqa: E402 (on the path peer_sources sets)
import _decode_cases  # noqa: E402
from cuda import Launch, Module
from peer_plans import ceil_div, packed
from translate_cuda import _METAL_CALLS

NAME, TITLE = "torch_mps", "torch-mps 2.15"
# The release the sources must come from (the tag, or the release/2.15 branch's head).
REVISION = "v2.15.0"
KERNELS = "aten/src/ATen/native/mps/kernels"
# What the kernels here include, as pytorch's tree names them: extract copies exactly these. The attention
# kernels are headers that torch's macOS wheels ship too (torch/include, which lays out c10/metal and
# ATen/native/mps/kernels as the tree does under aten/src); SoftMax.metal is in the source tree only.
HEADERS = [f"{KERNELS}/{f}" for f in ("SoftMax.h", "Gemv.h", "LinearAlgebra.h", "ScaledMM.h", "GroupedMM.h",
                                      "DecodeAttention.h", "PrefillAttention.h")] + \
    [f"c10/metal/{h}.h" for h in ("common", "float8", "utils", "reduction_utils")]
FILES = HEADERS + [f"{KERNELS}/SoftMax.metal"]
# The directory of torch's sources for this run (peers.py --torch-mps DIR), None when none was given: every
# torch-mps cell is then not applicable.
SOURCES: Path | None = None
NO_SOURCES = "no torch sources given (--torch-mps DIR)"
# Where torch 2.15 has no counterpart of a case on the proxy, why (peer_cases reports the cell n/a).
NOT_ON_PROXY = {
    "gemv_rows": "torch 2.15 runs no GEMV for more than one row: Gemv.h's kernels are rank-1 (M == 1), and its "
                 "few-row kernels (scaled_mm_few_rows) take e4m3fn activations only",
    "fp8": "torch 2.15's FP8 path (_scaled_mm, scaled_mm_few_rows) quantizes the activations to e4m3fn too; "
           "its kernel is not on the proxy yet",
    "moe": "torch 2.15's grouped_mm_few_rows (GroupedMM.metal) is not among the extracted sources",
}


# -- sources ----------------------------------------------------------------------------------------

def extract(dest: Path, tree: Path | None = None, git_dir: Path | None = None, rev: str = REVISION,
            wheel: Path | None = None) -> list[Path]:
    """Copies FILES from a pytorch checkout (tree) or a git directory at rev into dest, in pytorch's layout; or
    HEADERS from the include directory of a torch macOS wheel (wheel: torch/include of 2.15's)."""
    out = []
    for rel in HEADERS if wheel is not None else FILES:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if wheel is not None:
            shutil.copyfile(wheel / rel.removeprefix("aten/src/"), target)
        elif tree is not None:
            shutil.copyfile(tree / rel, target)
        else:
            show = subprocess.run(["git", f"--git-dir={git_dir}", "show", f"{rev}:{rel}"], capture_output=True,
                                  check=True)
            target.write_bytes(show.stdout)
        out.append(target)
    return out


# -- translation ------------------------------------------------------------------------------------

# The most threads per threadgroup torch's host launches each kernel with (kSoftmaxThreads: SoftMax.mm).
# sdpa_vector and its second pass: 32 SIMD groups (BN); the first pass 8; prefill_attention: WM x WN x 32;
# gemv_nt: NSIMD x 32.
LAUNCH_BOUNDS = [(re.compile(r"(log_)?softmax_(row|partial|finalize)_"), 256), (re.compile(r"(log_)?softmax_"), 1024),
                 (re.compile(r"sdpa_vector_2pass_1_"), 256), (re.compile(r"sdpa_vector_"), 1024),
                 (re.compile(r"prefill_attention_\w+_wm(\d)_wn(\d)"), None),
                 (re.compile(r"gemv_nt_[a-z]+_(\d+)_"), None)]


class TorchTranslator(peer_sources.PeerTranslator):
    """The peers' translator, with include/peer_torch.h, and c10/metal's own max/min/fma/... declarations kept as
    declarations: the translator qualifies an unqualified Metal call with metal::, which a declarator (the name
    after its return type) is not."""

    headers = (*peer_sources.PeerTranslator.headers, "peer_torch.h")

    def rewrite_tokens(self):
        for i, tok in enumerate(self.t):
            if tok.kind == "id" and tok.text in _METAL_CALLS and self.text(i + 1) == "(" and self.declarator(i):
                self.replace(i, self.code(tok.text, i))  # kept as it is: rewrite_tokens skips replaced tokens
        super().rewrite_tokens()

    def declarator(self, i: int) -> bool:
        """Whether the name at i is declared there: a type (a name or a template's `>`) comes right before it."""
        prev = self.t[i - 1] if i else None
        if prev is None:
            return False
        return prev.text == ">" or (prev.kind == "id" and prev.text not in ("return", "else", "case", "co_return"))

    @staticmethod
    def launch_bound(host: str) -> int:
        for pattern, n in LAUNCH_BOUNDS:
            if m := pattern.match(host):
                return n if n is not None else math.prod(int(g) for g in m.groups()) * 32
        return peer_sources.PeerTranslator.launch_bound(host)


def modules(sources: Path, gen: Path) -> list[Module]:
    """torch's modules, as Metal compiles them (__METAL__): SoftMax.metal whole (its own instantiations) where the
    sources have it, and the attention kernels (attention_source) in gen."""
    sources = sources.resolve()
    include = [sources, sources / "aten" / "src"]
    out = []
    if (sources / KERNELS / "SoftMax.metal").is_file():
        out.append(Module("torch_softmax", sources / KERNELS / "SoftMax.metal", include, None, ("__METAL__",),
                          TorchTranslator))
    gen.mkdir(parents=True, exist_ok=True)
    for name, text in (("torch_attention", attention_source(sources)), ("torch_gemv", gemv_source(sources))):
        peer_sources.write_if_changed(gen / f"{name}.metal", text)
        out.append(Module(name, gen / f"{name}.metal", include, None, ("__METAL__",), TorchTranslator))
    return out


# The lines of DecodeAttention.h and PrefillAttention.h that instantiate every dtype, head dim and mask (414
# kernels): attention_source instantiates, with the headers' own macros, only what the cases launch.
ALL_INSTANCES = re.compile(r"^\s*(INSTANTIATE_SDPA_VECTOR_HEADS|instantiate_attn_mask_helper)\(\w+(, \w+)?\);?\s*$",
                           re.M)


def attention_source(sources: Path, shapes: list[tuple] | None = None) -> str:
    """torch 2.15's attention kernels (the two headers, as Attention.metal includes them) with the
    instantiations that attention_route gives for shapes (heads, KV heads, dim, value dim, sinks, batch, query
    rows, keys, causal): by default the cases of benchmarks/_attention_cases.py."""
    items: list[str] = []
    for heads, kv_heads, dim, v_dim, sinks, _, q_len, keys, causal in shapes or [c.dims for c in
                                                                                 _attention_cases.cases()]:
        route = attention_route(heads, kv_heads, dim, v_dim, q_len, keys, sinks)
        c = str(bool(causal)).lower()
        if route[0] == "vector":
            new = [f'INSTANTIATE_SDPA_VECTOR_ONE(bfloat, {dim}, {dim}, {c}, false, float, "{mask_suffix(causal)}")']
        elif route[0] == "2pass":
            new = [f'INSTANTIATE_SDPA_VECTOR_2PASS_1_ONE(bfloat, {dim}, {dim}, {c}, false, float, '
                   f'"{mask_suffix(causal)}")', f"INSTANTIATE_SDPA_VECTOR_AGGREGATION(bfloat, {dim})"]
        elif route[0] == "prefill":
            _, bq, bk, wm = route
            new = [f"instantiate_attn(bfloat16, bfloat, {bq}, {bk}, {dim}, {wm}, 1, 0, {int(causal)}, bfloat16, "
                   "bfloat)"]
        else:
            new = []
        items += [i for i in new if i not in items]
    kernels = sources / KERNELS
    headers = [ALL_INSTANCES.sub("", (kernels / h).read_text()) for h in ("DecodeAttention.h", "PrefillAttention.h")]
    return "\n".join(["// torch's attention kernels (DecodeAttention.h, PrefillAttention.h verbatim) with the "
                      "instantiations the cases launch: tools/cuda_check/peer_torch.py.",
                      "#include <c10/metal/utils.h>", "#include <metal_stdlib>", "using namespace metal;",
                      *headers, *(i + ";" for i in items), ""])


# -- routing and plans ------------------------------------------------------------------------------

METAL_TYPE = {torch.float32: "float", torch.float16: "half", torch.bfloat16: "bfloat"}
SOFTMAX_THREADS, SIMDGROUP, MAX_NDIM = 256, 32, 16  # kSoftmaxThreads (SoftMax.h), c10::metal::simdgroup_size


def softmax_route(rows: int, cols: int) -> tuple:
    """Which kernel torch 2.15 runs for softmax over the last dim of a contiguous (rows, cols), as
    softmax_mps_impl (operations/SoftMax.mm) decides: ("row",) one SIMD group per row up to 1024 columns (2048
    with at least 128 rows); ("split", n_chunks, chunk_size) softmax_partial + softmax_finalize, chunks that fill
    512 threadgroups, none shorter than 2048; else ("general",) the 2D fallback."""
    row_dim_fits = cols <= 1024 or rows >= 128
    if cols <= 2048 and row_dim_fits:
        return ("row",)
    n_chunks = min(max(512 // rows, 1), ceil_div(cols, 2048))
    if n_chunks > 1:
        return ("split", n_chunks, ceil_div(cols, n_chunks))
    return ("general",)


def softmax_params(rows: int, cols: int, chunk: int, n_chunks: int) -> torch.Tensor:
    """SoftmaxParams<uint32_t> (SoftMax.h) as the host's narrow_params binds it: dim_size, num_rows, inner_size,
    chunk_size, n_chunks, ndim, dim, sizes[16], strides[16]."""
    sizes, strides = [rows, cols] + [0] * (MAX_NDIM - 2), [cols if rows > 1 else 0, 1] + [0] * (MAX_NDIM - 2)
    return cuda.u32s(cols, rows, 1, chunk, n_chunks, 2, 1, *sizes, *strides)


def softmax(x: torch.Tensor, y: torch.Tensor, partials: torch.Tensor | None = None) -> list[Launch]:
    """softmax_mps_impl's launches for x (rows, cols) contiguous (32-bit offsets: the _u32 kernels); partials:
    float32 (rows, n_chunks, 2) for the split route (softmax_partials_buffer)."""
    rows, cols = x.shape
    route, t = softmax_route(rows, cols), METAL_TYPE[x.dtype]
    if route[0] == "row":
        params = softmax_params(rows, cols, cols, 1)
        return [Launch(f"torch_softmax/softmax_row_{t}_u32", (ceil_div(rows, SOFTMAX_THREADS // SIMDGROUP), 1, 1),
                       (SOFTMAX_THREADS, 1, 1), [x, y, params])]
    if route[0] == "split":
        _, n_chunks, chunk = route
        params = softmax_params(rows, cols, chunk, n_chunks)
        grid = (n_chunks, rows, 1)
        return [Launch(f"torch_softmax/softmax_partial_{t}_u32", grid, (SOFTMAX_THREADS, 1, 1), [x, partials, params]),
                Launch(f"torch_softmax/softmax_finalize_{t}_u32", grid, (SOFTMAX_THREADS, 1, 1),
                       [x, y, partials, params])]
    raise ValueError(f"softmax {rows}x{cols}: torch's 2D fallback, not planned here")


def softmax_partials_buffer(x: torch.Tensor) -> torch.Tensor | None:
    """The split route's partials (max, sum per chunk), float32, or None for the other routes."""
    route = softmax_route(*x.shape)
    return torch.empty(x.shape[0], route[1], 2, device=cuda.DEV) if route[0] == "split" else None


def softmax_note(rows: int, cols: int) -> str:
    route = softmax_route(rows, cols)
    return "softmax_row" if route[0] == "row" else f"softmax_partial + softmax_finalize, {route[1]} chunks"


# -- GEMV (F.linear of one row: gemv_nt, as GemvPolicy::pick_nt sizes it) -----------------------------

# Gemv.h's instantiations of every config for every dtype, 32- and 64-bit indices (about 300 kernels):
# gemv_source instantiates, with its own MB_GEMV_NT, only the configs the cases take.
ALL_GEMVS = re.compile(r"^(MB_GEMV_(FLOAT|LP|I64_LP)\(\w+\)|MB_GEMV_(T|NT)_I64_E1?V?\([^)]*\))\s*$", re.M)
GEMV_TYPES = {torch.bfloat16: "bfloat", torch.float16: "half", torch.float32: "float"}


def gemv_config(dtype: torch.dtype, n: int, k: int) -> tuple[int, int]:
    """(SIMD groups per threadgroup, elements per load) of gemv_nt for an output of n over rows of k: pytorch's
    GemvPolicy::pick_nt (operations/GemmHeuristics.mm; its main branch after 2.15, whose Gemv.h instantiates
    exactly these configs): 8 SIMD groups from 8192 outputs for half types (4 from 2048 for float, else 16), 8
    elements per load (4 for float), halved while the row length is not a multiple."""
    nsimd = (4 if n >= 2048 else 16) if dtype == torch.float32 else (8 if n >= 8192 else 4)
    vec = 4 if dtype == torch.float32 else 8
    while vec > 1 and k % vec:
        vec //= 2
    return nsimd, vec


def gemv_source(sources: Path, shapes: list[tuple] | None = None) -> str:
    """Gemv.h (with LinearAlgebra.h's GemvDims and GemmEpilogue, as LinearAlgebra.metal includes them) and the
    gemv_nt instantiations of shapes (dtype, n, k): by default the one-row cases of benchmarks/_decode_cases.py
    (a unit-stride x)."""
    items: list[str] = []
    for dtype, n, k in shapes or [(c.dtype, *c.dims[:2]) for c in _decode_cases.cases()
                                  if c.family == "gemv" and c.dims[2] == 1]:
        nsimd, vec = gemv_config(dtype, n, k)
        x = gemv_x(vec)
        item = f'MB_GEMV_NT({GEMV_TYPES[dtype]}, {nsimd}, {vec}, none, None, {x}, {str(x == "xc").lower()}, "", false)'
        items += [item] if item not in items else []
    kernels = sources / KERNELS
    return "\n".join(["// torch's GEMV kernels (LinearAlgebra.h, Gemv.h verbatim) with the instantiations the cases "
                      "launch: tools/cuda_check/peer_torch.py.", "#include <c10/metal/utils.h>",
                      "#include <metal_stdlib>", "using namespace metal;", (kernels / "LinearAlgebra.h").read_text(),
                      ALL_GEMVS.sub("", (kernels / "Gemv.h").read_text()), *items, ""])


def gemv(w: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> list[Launch]:
    """F.linear(x, w) for one row of x (1, k), w (n, k) row-major, y (1, n): gemv_nt over w's rows, one SIMD group
    per output, without bias (GemvDims: n, K, ld, ms, xs, bias_r, bias_c; alpha and beta bound, unread)."""
    (n, k), t = w.shape, GEMV_TYPES[w.dtype]
    nsimd, vec = gemv_config(w.dtype, n, k)
    dims = packed("7q", n, k, w.stride(0), w.stride(1), x.stride(-1), 0, 0)
    return [Launch(f"torch_gemv/gemv_nt_{t}_{nsimd}_{vec}_none_{gemv_x(vec)}", (ceil_div(n, nsimd), 1, 1),
                   (32 * nsimd, 1, 1), [w, x, y, dims, y, packed("2f", 1.0, 0.0)])]


def gemv_x(vec: int) -> str:
    """How gemv_nt reads x: as vectors where it is unit-stride and vec > 1 ("xc"), else element by element
    ("xs": Gemv.h builds no vector load of one element)."""
    return "xc" if vec > 1 else "xs"


# -- attention (operations/Attention.mm's _scaled_dot_product_attention_math_mps) ---------------------

VECTOR_DIMS, PREFILL_DIMS = (64, 96, 128, 256), (32, 64, 72, 80, 96, 128, 256)
# sdpa_vector_2pass's fixed split of the keys (DecodeAttention.h's `blocks`).
ATTENTION_BLOCKS = 32


def attention_route(heads: int, kv_heads: int, dim: int, v_dim: int, q_len: int, keys: int, sinks: bool) -> tuple:
    """Which kernel torch 2.15 runs for a call without a mask: ("vector",) sdpa_vector, one threadgroup per query
    head and row; ("2pass",) sdpa_vector_2pass_1 + _2, from 1024 keys (or GQA from 4096, a clause the first
    covers); ("prefill", BQ, BK, WM) its flash kernel's tiles by head dim; ("general", why) MPSGraph. On macOS
    26.2 and later 2.15 runs fp16/bf16 prefill on Metal Performance Primitives tensors instead (MppAttention.h),
    which no GPU but Apple's runs: the proxy stands for the route older systems take."""
    if sinks:
        return ("general", "F.scaled_dot_product_attention has no sinks")
    if q_len <= 8 and q_len <= keys:
        if dim == v_dim and dim in VECTOR_DIMS:
            return ("2pass",) if keys >= 1024 or (kv_heads < heads and keys >= 4096) else ("vector",)
    elif keys > 0 and dim == v_dim and dim in PREFILL_DIMS:
        return ("prefill", *((32, 32, 4) if dim <= 96 else (32, 16, 4) if dim == 128 else (16, 8, 2)))
    return ("general", f"MPSGraph (sdpa_general_mps): no kernel for head dims {dim}/{v_dim} at {q_len} rows")


def attention_scratch(q: torch.Tensor, keys: int) -> tuple | None:
    """sdpa_vector_2pass's intermediates: partials (B·H·L, blocks, V) in q's dtype, sums and maxs (B·H·L,
    blocks) float32; None for the other routes."""
    b, heads, q_len, dim = q.shape
    if attention_route(heads, heads, dim, dim, q_len, keys, False)[0] != "2pass":
        return None
    rows = b * heads * q_len
    return (torch.empty(rows, ATTENTION_BLOCKS, dim, dtype=q.dtype, device=cuda.DEV),
            torch.empty(rows, ATTENTION_BLOCKS, device=cuda.DEV), torch.empty(rows, ATTENTION_BLOCKS, device=cuda.DEV))


def attention(q, k, v, out, causal: bool, scratch: tuple | None = None) -> list[Launch]:
    """The launches of _scaled_dot_product_attention_math_mps for (B, H, L, D) q over (B, KV, S, D) k, v with
    unit last strides, no mask, the default scale; out (B, H, L, D) contiguous. scratch: attention_scratch's."""
    (b, heads, q_len, dim), (kv_heads, keys) = q.shape, k.shape[1:3]
    route = attention_route(heads, kv_heads, dim, v.shape[-1], q_len, keys, False)
    if route[0] == "general":
        raise ValueError(f"torch runs no Metal kernel here: {route[1]}")
    scale, gqa = dim ** -0.5, heads // kv_heads
    if route[0] == "prefill":
        _, bq, bk, wm = route
        # PrefillAttnParams: B, H, D, qL, kL, gqa_factor, scale, softcapping (1: none), then the int64 (batch,
        # head, row) strides of Q, K, V, O; PrefillAttnMaskParams (4 int64) bound though unread.
        params = packed("6i2f12q", b, heads, dim, q_len, keys, gqa, scale, 1.0, *q.stride()[:3],
                             *k.stride()[:3], *v.stride()[:3], *out.stride()[:3])
        name = f"torch_attention/prefill_attention_bfloat16_bq{bq}_bk{bk}_bd{dim}_wm{wm}_wn1_hm0_dc{int(causal)}" \
               "_maskbfloat16"
        return [Launch(name, (ceil_div(q_len, bq), heads, b), (32, wm, 1), [q, k, v, out, params,
                                                                         packed("4q", 0, 0, 0, 0), q])]
    t = METAL_TYPE[q.dtype]
    strides = [packed("4I", q.stride(1), k.stride(1), v.stride(1), 0),
               packed("4I", q.stride(2), k.stride(2), v.stride(2), 0), packed("f", scale), q,
               packed("4I", 0, 0, 0, 0), packed("4I", q.stride(0), k.stride(0), v.stride(0), heads)]
    head = (packed("I", gqa), packed("I", keys))
    suffix = f"{dim}_{dim}{mask_suffix(causal)}"
    if route[0] == "vector":
        return [Launch(f"torch_attention/sdpa_vector_{t}_{suffix}", (b * heads, q_len, 1), (1024, 1, 1),
                       [q, k, v, out, *head, *strides])]
    partials, sums, maxs = scratch
    return [Launch(f"torch_attention/sdpa_vector_2pass_1_{t}_{suffix}", (b * heads, q_len, ATTENTION_BLOCKS),
                   (256, 1, 1), [q, k, v, partials, sums, maxs, *head, *strides]),
            Launch(f"torch_attention/sdpa_vector_2pass_2_{t}_{dim}", (b * heads, q_len, 1), (1024, 1, 1),
                   [partials, sums, maxs, out])]


def mask_suffix(causal: bool) -> str:
    """The vector kernels' host-name suffix for a call without a mask."""
    return "_masknone_causal" if causal else "_masknone"


def attention_note(route: tuple) -> str:
    return {"vector": "sdpa_vector (1 pass)", "2pass": f"sdpa_vector_2pass, {ATTENTION_BLOCKS} blocks",
            "prefill": "prefill_attention (not the MPP kernel of macOS 26.2+)"}.get(route[0], "")


def main():
    ap = argparse.ArgumentParser(description="Extracts the torch sources the torch-mps peer reads.")
    ap.add_argument("command", choices=["extract"])
    ap.add_argument("dest", type=Path)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--tree", type=Path, help="a pytorch checkout at the release")
    src.add_argument("--git-dir", type=Path, help="a pytorch git directory (with --rev)")
    src.add_argument("--wheel", type=Path, help="torch/include of a torch 2.15 macOS wheel: the headers only "
                     "(SoftMax.metal is not among them)")
    ap.add_argument("--rev", default=REVISION)
    args = ap.parse_args()
    for path in extract(args.dest, args.tree, args.git_dir, args.rev, args.wheel):
        print(path)


if __name__ == "__main__":
    main()
