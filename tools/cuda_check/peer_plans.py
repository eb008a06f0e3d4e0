"""The peers' host plans: which kernel, grid, threadgroup and arguments ggml-metal's host
(ggml-metal-ops.cpp `ggml_metal_op_*`, ggml-metal-device.cpp) and MLX's (matmul.cpp, softmax.cpp
`*::eval_gpu`) launch for the cases of tools/cuda_check/peers.py. Kernels are named `module/host name`
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
