"""The peers' host plans: which kernel, grid, threadgroup and arguments ggml-metal's host
(ggml-metal-ops.cpp `ggml_metal_op_*`, ggml-metal-device.cpp, ggml-metal-tuning.cpp) and MLX's (matmul.cpp,
softmax.cpp, scaled_dot_product_attention.cpp `*::eval_gpu`) launch for the cases of tools/cuda_check/peers.py. Kernels are named `module/host name`
(peer_sources.modules). ggml takes float32 activations and writes float32.
"""

from __future__ import annotations

import ctypes
import functools
import re
import struct
from pathlib import Path

import torch

import cuda
from cuda import Launch

GGML_TYPE = {torch.bfloat16: "bf16", torch.float16: "f16"}
MLX_TYPE = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}
_CTYPES = {"int32_t": ctypes.c_int32, "uint64_t": ctypes.c_uint64, "int16_t": ctypes.c_int16,
           "uint32_t": ctypes.c_uint32, "int64_t": ctypes.c_int64, "float": ctypes.c_float,
           "uint16_t": ctypes.c_uint16, "int8_t": ctypes.c_int8, "uint8_t": ctypes.c_uint8, "bool": ctypes.c_bool}


def ceil_div(a: int, b: int) -> int:
    return (a + b - 1) // b


def packed(fmt: str, *values) -> torch.Tensor:
    """Scalars or arrays as a device buffer (what setBytes binds), in struct's format."""
    return torch.frombuffer(bytearray(struct.pack("<" + fmt, *values)), dtype=torch.uint8).to(cuda.DEV)


@functools.cache
def _ggml_struct(header: Path, name: str) -> type:
    """A ggml_metal_kargs_* struct of ggml-metal-impl.h as ctypes: the C layout, padding included."""
    m = re.search(r"typedef struct \{([^{}]*)\}\s*" + re.escape(name) + r"\s*;", header.read_text())
    if not m:
        raise KeyError(f"{header}: no struct {name}")
    fields = []
    for line in m.group(1).splitlines():
        line = re.sub(r"//.*", "", line).strip()
        if line:
            f = re.fullmatch(r"(\w+)\s+(\w+)\s*(?:\[(\d+)\])?\s*;", line)
            if not f:
                raise ValueError(f"{name}: cannot parse {line!r}")
            fields.append((f.group(2), _CTYPES[f.group(1)] * int(f.group(3)) if f.group(3) else _CTYPES[f.group(1)]))
    return type(name, (ctypes.Structure,), {"_fields_": fields})


class Ggml:
    """ggml-metal's host, with its argument structs read from the sources (peers/ggml/ggml-metal)."""

    def __init__(self, peers: Path):
        self.header = peers / "ggml" / "ggml-metal" / "ggml-metal-impl.h"

    def args(self, name: str, **values) -> torch.Tensor:
        cls = _ggml_struct(self.header, name)
        missing = [f for f, _ in cls._fields_ if f not in values]
        if missing:
            raise ValueError(f"{name}: no value for {missing}")
        return torch.frombuffer(bytearray(bytes(cls(**values))), dtype=torch.uint8).to(cuda.DEV)

    def gemv(self, w: torch.Tensor, x32: torch.Tensor, y32: torch.Tensor) -> list[Launch]:
        """ggml_metal_op_mul_mat: mul_mv_ext for 2 to 8 rows with K % 128 == 0, else mul_mv (4 at a time)."""
        (n, k), m, es, t = w.shape, x32.shape[0], w.element_size(), GGML_TYPE[w.dtype]
        sizes = dict(ne00=k, ne01=n, ne02=1, nb00=es, nb01=k * es, nb02=n * k * es, nb03=n * k * es, ne10=k,
                     ne11=m, ne12=1, nb10=4, nb11=k * 4, nb12=m * k * 4, nb13=m * k * 4, ne0=n, ne1=m, r2=1, r3=1)
        if 2 <= m <= 8 and k % 128 == 0:
            # nsg 2, nxpsg 8 (module ggml_mv_ext); two rows with K % 256 == 0 would take nxpsg 16.
            assert m > 2 or k % 256, "two rows with K % 256 == 0: nxpsg 16, not built"
            nsg, nxpsg = 2, 8
            r0ptg, r1ptg = (32 // nxpsg) * nsg, {3: 3, 6: 3, 4: 4, 7: 4, 8: 4, 5: 5, 2: 2}[m]
            return [Launch(f"ggml_mv_ext/kernel_mul_mv_ext_{t}_f32_r1_{r1ptg}",
                           (ceil_div(n, r0ptg), ceil_div(m, r1ptg), 1), (32, nsg, 1),
                           [self.args("ggml_metal_kargs_mul_mv_ext", **sizes), w, x32, y32])]
        assert k >= 384 and k % 4 == 0, "module ggml_mv holds nsg 4 and the 4-wide kernels"
        nsg, nr0 = 4, 2
        return [Launch(f"ggml_mv/kernel_mul_mv_{t}_f32_4", (ceil_div(n, nr0), m, 1), (32, nsg, 1),
                       [self.args("ggml_metal_kargs_mul_mv", nr0=nr0, **sizes), w, x32, y32], smem=32 * 4 * nr0)]

    def moe(self, w: torch.Tensor, x32: torch.Tensor, ids: torch.Tensor, y32: torch.Tensor) -> list[Launch]:
        """ggml_metal_op_mul_mat_id below 32 tokens: mul_mv_id. w (E, n, k); x32 (T, 1 or top-k, k); ids (T,
        top-k) int32; y32 (T, top-k, n)."""
        (e, n, k), (tokens, rows, _), topk = w.shape, x32.shape, ids.shape[1]
        es, nsg, nr0 = w.element_size(), 4, 2
        assert k >= 384, "module ggml_mv holds nsg 4"
        a = self.args("ggml_metal_kargs_mul_mv_id", nei0=topk, nei1=tokens, nbi1=topk * 4, ne00=k, ne01=n, ne02=e,
                      nb00=es, nb01=k * es, nb02=n * k * es, ne10=k, ne11=rows, ne12=tokens, ne13=1, nb10=4,
                      nb11=k * 4, nb12=rows * k * 4, ne0=n, ne1=topk, nb1=n * 4, nr0=nr0)
        return [Launch(f"ggml_mv/kernel_mul_mv_id_{GGML_TYPE[w.dtype]}_f32_4", (ceil_div(n, nr0), 1, topk * tokens),
                       (32, nsg, 1), [a, w, x32, y32, ids], smem=32 * 4 * nr0)]

    def softmax(self, x: torch.Tensor, y: torch.Tensor) -> list[Launch]:
        """ggml_metal_op_soft_max (float32 only) without mask or sinks, scale 1."""
        rows, cols = x.shape
        total = x.numel() * 4
        nth, limit = 32, cols // 4 if cols % 4 == 0 else cols
        while nth < limit and nth * rows < 256:
            nth *= 2
        a = self.args("ggml_metal_kargs_soft_max", ne00=cols, ne01=rows, ne02=1, nb01=cols * 4, nb02=total,
                      nb03=total, ne11=0, ne12=0, ne13=0, nb11=0, nb12=0, nb13=0, nb1=cols * 4, nb2=total,
                      nb3=total, scale=1.0, max_bias=0.0, m0=1.0, m1=1.0, n_head_log2=1)
        return [Launch("ggml_softmax/kernel_soft_max_f32" + ("_4" if cols % 4 == 0 else ""), (rows, 1, 1),
                       (nth, 1, 1), [a, x, x, x, y], smem=32 * 4)]

    def flash_attn(self, q32, k, v, out32, sinks32=None, mask16=None, scratch=None) -> list[Launch]:
        """q32 (B, H, L, D) float32; k, v (B, KV, S, D) bf16; out32 (B, L, H, V) float32 (ggml's dst order);
        sinks32 (H,); mask16 (L, S) float16 (-inf where masked: how llama.cpp gives causality); scratch a
        float32/int8 buffer for the workgroups' partials or the mask's block map."""
        (b, heads, q_len, dim), (_, kv_heads, keys, _), v_dim = q32.shape, k.shape, v.shape[-1]
        es, vec = k.element_size(), ggml_fa_use_vec(dim, q_len)
        ncpsg = GGML_FA_VEC_NCPSG if vec else GGML_FA_NCPSG
        assert keys % ncpsg == 0, "keys a multiple of the chunk: no pad kernel (has_kvpad false)"
        mask_rows = mask16.shape[0] if mask16 is not None else 0
        sizes = dict(ne01=q_len, ne02=heads, ne03=b, nb01=dim * 4, nb02=q_len * dim * 4, nb03=heads * q_len * dim * 4,
                     ne11=keys, ne_12_2=kv_heads, ne_12_3=b, ns10=dim, nb11=dim * es, nb12=keys * dim * es,
                     nb13=kv_heads * keys * dim * es, ns20=v_dim, nb21=v_dim * es, nb22=keys * v_dim * es,
                     nb23=kv_heads * keys * v_dim * es, ne31=mask_rows, ne32=1 if mask_rows else 0,
                     ne33=1 if mask_rows else 0, nb31=keys * 2, nb32=mask_rows * keys * 2, nb33=mask_rows * keys * 2,
                     ne1=heads, ne2=q_len, ne3=b, scale=dim ** -0.5, max_bias=0.0, m0=1.0, m1=1.0,
                     n_head_log2=1 << (heads.bit_length() - 1), logit_softcap=0.0)
        module = ggml_fa_module(dim, v_dim, sinks32 is not None, keys, vec)
        mask = mask16 if mask16 is not None else q32
        sink = sinks32 if sinks32 is not None else q32
        if vec:
            nsg, nwg = ggml_fa_vec_nsg(keys), GGML_FA_VEC_NWG
            smem = -(-((ceil_div(dim, 128) * 128 + 4 * ncpsg + 2 * ceil_div(v_dim, 128) * 128) * nsg * 2) // 16) * 16
            a = self.args("ggml_metal_kargs_flash_attn_ext_vec", **sizes, n_kv_max_padded=0)
            rows = b * heads * q_len
            return [Launch(f"{module}/kernel_flash_attn_ext_vec_{GGML_TYPE[k.dtype]}_dk{dim}_dv{v_dim}",
                           (q_len, heads, b * nwg), (32, nsg, 1), [a, q32, k, v, mask, sink, out32, scratch, q32],
                           smem=smem),
                    Launch(f"{module}/kernel_flash_attn_ext_vec_reduce", (rows, 1, 1), (32 * nwg, 1, 1),
                           [self.args("ggml_metal_kargs_flash_attn_ext_vec_reduce", nrows=rows), scratch, out32])]
        nqptg, nsg = GGML_FA_NQPTG, 8 if dim >= 512 else 4
        launches = []
        if mask16 is not None:  # the map of the mask's blocks (all masked, all zero, mixed) the kernel skips by
            launches.append(Launch(f"{module}/kernel_flash_attn_ext_blk", (ceil_div(keys, ncpsg), ceil_div(q_len, nqptg), 1),
                                   (32, 1, 1), [self.args("ggml_metal_kargs_flash_attn_ext_blk", ne01=q_len, ne30=keys,
                                                          ne31=mask_rows, ne32=1, ne33=1, nb31=keys * 2,
                                                          nb32=mask_rows * keys * 2, nb33=mask_rows * keys * 2),
                                                mask16, scratch]))
        smem = -(-(nqptg * (dim + 2 * ceil_div(v_dim, 64) * 64 + 4 * ncpsg) * 2) // 16) * 16
        a = self.args("ggml_metal_kargs_flash_attn_ext", **sizes)
        launches.append(Launch(f"{module}/kernel_flash_attn_ext_{GGML_TYPE[k.dtype]}_dk{dim}_dv{v_dim}",
                               (ceil_div(q_len, nqptg), heads, b), (32, nsg, 1),
                               [a, q32, k, v, mask, sink, out32, scratch, out32], smem=smem))
        return launches

    @staticmethod
    def scratch_bytes(b: int, heads: int, q_len: int, keys: int, dim: int, v_dim: int) -> int:
        """The bytes flash_attn's scratch takes: the vec kernel's partials (ggml_metal_op_flash_attn_ext_extra_tmp)
        or the mask's block map (_extra_blk)."""
        if ggml_fa_use_vec(dim, q_len):
            return 4 * min(q_len, 32) * heads * b * GGML_FA_VEC_NWG * (v_dim + 2)
        return ceil_div(keys, GGML_FA_NCPSG) * ceil_div(q_len, GGML_FA_NQPTG)


def mlx_gemv(w: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> list[Launch]:
    """Matmul::eval_gpu: gemv for one row, gemv_wide for 2 to 5 (M3 and later), a pass of all rows."""
    (n, k), m, t = w.shape, x.shape[0], MLX_TYPE[w.dtype]
    if m == 1:
        bm = 8 if n >= 4096 else 4
        consts = [packed("i", k), packed("i", n), packed("i", k), packed("f", 1.0), packed("f", 0.0),
                  packed("i", 1), packed("i", 1), packed("q", 0), packed("q", 0), packed("q", 0), packed("i", 1)]
        return [Launch(f"mlx_gemv/gemv_{t}_bm{bm}_bn1_sm1_sn32_tm4_tn4_nc0_axpby0", (ceil_div(n, bm * 4), 1, 1),
                       (32, 1, bm), [w, x, w, y, *consts])]
    assert m == 4, "the wide kernel is built for one pass of four rows"
    consts = [packed("i", k), packed("i", n), packed("i", m), packed("i", k), packed("i", k), packed("f", 1.0),
              packed("f", 0.0), packed("i", 1), packed("i", 1), packed("q", 0), packed("q", 0), packed("q", 0),
              packed("i", 0), packed("i", 0)]
    return [Launch(f"mlx_gemv/gemv_wide_{t}_nv4_kl32", (1, ceil_div(n, 4), 1), (32, 4, 1), [w, x, w, y, *consts])]


def mlx_gather(w: torch.Tensor, vectors: torch.Tensor, vector_ids: torch.Tensor, expert_ids: torch.Tensor,
               y: torch.Tensor) -> list[Launch]:
    """GatherMM::eval_gpu with one row per gathered vector, indices unsorted (mlx-lm sorts from 64 rows on):
    gemv_gather. w (E, n, k); row p of y is w[expert_ids[p]] @ vectors[vector_ids[p]]."""
    (e, n, k), rows, t = w.shape, y.shape[0], MLX_TYPE[w.dtype]
    bm = 8 if n >= 4096 else 4
    consts = [packed("i", k), packed("i", n), packed("i", k), packed("f", 1.0), packed("f", 0.0), packed("i", 1),
              packed("i", rows), packed("2q", 1, 1), packed("i", 1), packed("i", vectors.shape[0]), packed("q", k),
              packed("i", 1), packed("i", e), packed("q", n * k)]
    return [Launch(f"mlx_gemv/gemv_gather_{t}_bm{bm}_bn1_sm1_sn32_tm4_tn4", (ceil_div(n, bm * 4), 1, rows),
                   (32, 1, bm), [w, vectors, w, y, *consts, vector_ids, expert_ids])]


def mlx_softmax(x: torch.Tensor, y: torch.Tensor) -> list[Launch]:
    """Softmax::eval_gpu: a threadgroup per row, block up to 4096 columns, looped beyond; half and bfloat
    precise (float accumulation, as ours and torch's)."""
    rows, cols = x.shape
    t = MLX_TYPE[x.dtype] if x.dtype == torch.float32 else "precise_" + MLX_TYPE[x.dtype]
    if cols <= 4096:
        kernel, threads = f"block_softmax_{t}", 32 * ceil_div(ceil_div(cols, 4), 32)
    else:
        kernel, threads = f"looped_softmax_{t}", 1024
    return [Launch(f"mlx_softmax/{kernel}", (rows, 1, 1), (threads, 1, 1), [x, y, packed("i", cols)])]


# -- attention ---------------------------------------------------------------------------------------
# MLX: ScaledDotProductAttention::eval_gpu (scaled_dot_product_attention.cpp at mlx/host/COMMIT); ggml:
# ggml_metal_op_flash_attn_ext with the pipelines of ggml-metal-device.cpp and ggml-metal-tuning.cpp.

# MLX sizes its 2-pass decode by the device's architecture suffix: 'd' is the Ultra class, the largest Apple
# GPUs (60 to 80 cores), the nearest to a GPU of 132 SMs. On it MLX runs no NAX kernels (those need M5's
# neural accelerators), so prefill is steel_attention.
MLX_DEVICE_CLASS = "d"
# The routes whose kernels translate and run on the proxy (every route MLX takes for these cases: steel_attention's
# MMA tiles read simdgroup matrices element-wise, laid out in the peers' translations as Apple's GPUs do);
# MLX_TRANSLATED_NOT says why for a route that does not.
MLX_TRANSLATED = ("vector", "2pass", "steel")
MLX_TRANSLATED_NOT: dict[str, str] = {}
# The head dims (K, V) of ggml's bf16 simdgroup-matrix kernel (fa_f16.metal's kernel_flash_attn_ext_bf16_*).
GGML_FA_DIMS = {(32, 32), (40, 40), (48, 48), (64, 64), (72, 72), (80, 80), (96, 96), (96, 64), (112, 112),
                (128, 128), (192, 192), (192, 128), (256, 256), (320, 256), (512, 512), (576, 512)}
# ggml's FA tuning table holds no bf16 rows: bf16 KV takes the baseline (one query per threadgroup) on every
# GPU family, so the family does not matter here.
GGML_FA_VEC_NE = {(32, 32): 4, (64, 64): 2, (96, 96): 4, (96, 64): 4, (128, 128): 1, (192, 192): 2,
                  (192, 128): 2, (256, 256): 1, (320, 256): 2, (512, 512): 1, (576, 512): 2}  # baseline NE
GGML_FA_VEC_NWG, GGML_FA_VEC_NCPSG = 32, 32  # OP_FLASH_ATTN_EXT_VEC_NCPSG
GGML_FA_NQPTG, GGML_FA_NCPSG = 8, 64  # OP_FLASH_ATTN_EXT_NQPSG, OP_FLASH_ATTN_EXT_NCPSG


def mlx_attention_route(heads: int, kv_heads: int, dim: int, v_dim: int, q_len: int, keys: int) -> tuple:
    """What MLX's host runs for a call without an array mask: ("vector",), ("2pass", blocks), ("steel", bk), or
    ("unfused", why) where it computes the attention with ops instead of a kernel (has_fused_kernel,
    use_fallback)."""
    gqa = heads // kv_heads
    if q_len > 8:
        if not (dim == v_dim and dim in (64, 72, 80, 96, 128, 192, 256)):
            return ("unfused", f"no full-attention kernel for head dims {dim}/{v_dim}")
        if dim in (192, 256):
            return ("unfused", f"its host calls ops for prefill at head dim {dim} (faster on Apple GPUs)")
        return ("steel", 32 if dim < 128 else 16)
    if not ((dim == v_dim and dim in (64, 96, 128, 192, 256)) or (dim, v_dim) == (192, 128)):
        return ("unfused", f"no vector kernel for head dims {dim}/{v_dim}")
    if q_len > keys or q_len * gqa > 32:
        return ("unfused", "query rows x GQA factor past 32")
    if dim == v_dim == 192:
        return ("unfused", "its host calls ops at head dim 192")
    if (MLX_DEVICE_CLASS in "ds" and keys >= 1024) or (kv_heads < heads and keys >= 4096):
        return ("2pass", mlx_sdpa_blocks(gqa * q_len, keys))
    return ("vector",)


def mlx_sdpa_blocks(n_simds: int, keys: int) -> int:
    """sdpa_vector_2pass: the blocks the keys are split into, by device class (here MLX_DEVICE_CLASS)."""
    if MLX_DEVICE_CLASS == "s":
        if keys > 1024 and n_simds > 4:
            return 128 if keys <= 8192 else 256 if keys <= 32768 else 512 if keys <= 65536 else 1024
        return 64
    if MLX_DEVICE_CLASS == "d":
        if n_simds <= 2 and keys > 8192:
            return 256
        if n_simds >= 6 and keys >= 16384:
            return 512 if keys < 65536 else 1024
        return 128
    return 64 if n_simds >= 4 else 32


def mlx_sdpa_module(blocks: int, sinks: bool) -> str:
    """The module of MLX's vector kernels with these function constants (peer_sources.modules)."""
    return f"mlx_sdpa{'_sinks' if sinks else ''}_b{blocks}"


def mlx_attention(q, k, v, out, sinks=None, blocks_out=None) -> list[Launch]:
    """ScaledDotProductAttention::eval_gpu on contiguous (B, H, L, D) q and (B, KV, S, D) k, v, without a mask;
    sinks (H,) in q's dtype. blocks_out: the 2-pass intermediates (partials, sums, maxs), from mlx_scratch."""
    (b, heads, q_len, dim), (_, kv_heads, keys, _), v_dim = q.shape, k.shape, v.shape[-1]
    route = mlx_attention_route(heads, kv_heads, dim, v_dim, q_len, keys)
    t = {torch.bfloat16: "bfloat16_t", torch.float16: "float16_t", torch.float32: "float"}[q.dtype]
    scale = packed("f", dim ** -0.5)
    # K/V head stride: a single KV head takes the batch stride (k.shape(1) == 1 ? strides(0) : strides(1)).
    kv_strides = [packed("Q", k.stride(0) if kv_heads == 1 else k.stride(1)), packed("Q", k.stride(2)),
                  packed("Q", v.stride(0) if kv_heads == 1 else v.stride(1)), packed("Q", v.stride(2))]
    if route[0] == "vector":
        module = mlx_sdpa_module(mlx_sdpa_blocks(1, 0), sinks is not None)  # the 1-pass kernel reads no blocks
        args = [q, k, v, out, packed("i", heads // kv_heads), packed("i", keys), *kv_strides, scale]
        if sinks is not None:
            args += [q] * 5 + [sinks, packed("i", heads)]  # buffers 11-15 (the mask's): never read
        return [Launch(f"{module}/sdpa_vector_{t}_{dim}_{v_dim}", (b * heads, q_len, 1), (1024, 1, 1), args)]
    if route[0] == "2pass":
        blocks = route[1]
        partials, sums, maxs = blocks_out
        module = mlx_sdpa_module(blocks, sinks is not None)
        args = [q, k, v, partials, sums, maxs, q, packed("i", keys), *kv_strides, scale]  # buffer 6: no argument
        if sinks is not None:
            args += [q] * 5 + [sinks]  # buffers 13-17 (the mask's): never read
        return [Launch(f"{module}/sdpa_vector_2pass_1_{t}_{dim}_{v_dim}", (kv_heads, b, blocks),
                       (32, heads // kv_heads, q_len), args),
                Launch(f"{module}/sdpa_vector_2pass_2_{t}_{v_dim}", (b * heads, q_len, 1), (1024, 1, 1),
                       [partials, sums, maxs, out, packed("i", blocks)])]
    if route[0] == "steel":
        bq, bk = 32, route[1]
        assert q_len % bq == 0 and keys % bk == 0, "module mlx_steel is built for aligned blocks (align_Q, align_K)"
        nq, nk = ceil_div(q_len, bq), ceil_div(keys, bk)
        # AttnParams (steel/attn/params.h): B, H, D, qL, kL, gqa_factor, scale, NQ, NK, NQ_aligned, NK_aligned,
        # qL_rem, kL_rem, qL_off, then the int64 Q, K, V, O strides (batch, head, row).
        params = packed("6if7i12q", b, heads, dim, q_len, keys, heads // kv_heads, dim ** -0.5, nq, nk,
                        q_len // bq, keys // bk, q_len - q_len // bq * bq, keys - keys // bk * bk, keys - q_len,
                        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out.stride()[:3])
        name = f"mlx_steel{'_sinks' if sinks is not None else ''}/steel_attention_{MLX_TYPE[q.dtype]}_bq{bq}_bk{bk}" \
               f"_bd{dim}_wm4_wn1_mask{MLX_TYPE[q.dtype]}"
        args = [q, k, v, out, params] + ([q, q, sinks] if sinks is not None else [])  # 5, 6: the mask's
        return [Launch(name, (nq, heads, b), (32, 4, 1), args)]
    raise ValueError(f"MLX runs no kernel here: {route[1]}")


def mlx_scratch(q, v_dim: int, blocks: int, sets: int) -> list[tuple]:
    """sdpa_vector_2pass's intermediates per input set: partials (B, H, L, blocks, V) in q's dtype, sums and
    maxs (B, H, L, blocks) float32."""
    b, heads, q_len, _ = q.shape
    return [(torch.empty(b, heads, q_len, blocks, v_dim, dtype=q.dtype, device=cuda.DEV),
             torch.empty(b, heads, q_len, blocks, device=cuda.DEV),
             torch.empty(b, heads, q_len, blocks, device=cuda.DEV)) for _ in range(sets)]


def ggml_fa_vec_nsg(keys: int) -> int:
    """ggml_metal_op_flash_attn_ext (vec): SIMD groups per threadgroup, doubled up to 4 while 2 x 32 workgroups
    x nsg x 32 keys fall short of the keys."""
    nsg = 1
    while 2 * GGML_FA_VEC_NWG * nsg * GGML_FA_VEC_NCPSG < keys and nsg < 4:
        nsg *= 2
    return nsg


def ggml_fa_module(dim: int, v_dim: int, sinks: bool, keys: int, vec: bool) -> str:
    """The module of ggml's flash-attention kernels with these function constants (peer_sources.modules): vec
    (decode, by nsg) or the simdgroup-matrix kernel (prefill, a causal mask)."""
    base = f"ggml_fa_vec_dk{dim}_dv{v_dim}_nsg{ggml_fa_vec_nsg(keys)}" if vec else f"ggml_fa_dk{dim}_dv{v_dim}"
    return base + ("_sinks" if sinks else "")


def ggml_attention_unsupported(dim: int, v_dim: int, q_len: int) -> str | None:
    """Why ggml's kernels cannot run a bf16 call here, or None: its bf16 instantiations (fa_vec_f16.metal for
    decode, fa_f16.metal for prefill)."""
    if not ggml_fa_use_vec(dim, q_len):
        return None if (dim, v_dim) in GGML_FA_DIMS else f"no flash_attn_ext kernel for head dims {dim}/{v_dim}"
    if (dim, v_dim) not in GGML_FA_VEC_NE:
        return f"no vec kernel for head dims {dim}/{v_dim}"
    return None


def ggml_fa_use_vec(dim: int, q_len: int) -> bool:
    """ggml_metal_op_flash_attn_ext_use_vec: fewer than 20 queries and a head size that 32 divides."""
    return q_len < 20 and dim % 32 == 0
