"""The peers' Metal kernels (llama.cpp's ggml-metal, MLX) as modules of the CUDA check, from a directory of
their sources (--peers DIR: ggml/ and mlx/ as ../shared/peer_proxy/sources holds them; MIT-licensed, never
copied into this repository). Their kernel code is used verbatim:

- ggml (llama-cpp-python 0.3.36): the mat-vec kernels are excerpts of kernels/mul_mv.metal (the
  declarations these kernels need, chosen by name: GGML_MV_KEEP), after common.h as the file includes it;
  kernels/softmax.metal whole. Function constants get the values ggml's host sets for these shapes
  (ggml-metal-device.cpp), one module per set of values.
- MLX (mlx-metal 0.32.4): gemv.h and softmax.h whole, after a utils.h reduced to the declarations they use
  (MLX_UTILS_KEEP); the instantiation lines of MLX's gemv.metal / softmax.metal (mlx/host, from
  github.com/ml-explore/mlx) for the variants its host picks for these shapes.

All of it goes through the project's translator and shim (translate_cuda.py, include/mtlcuda.h), plus
include/peer_ext.h for what only the peers use.
"""

from __future__ import annotations

import re
from pathlib import Path

import peer_extract as extract
from cuda import Module
from generate_sources import write_if_changed
from translate_cuda import CudaTranslator, launch_bound

# -- ggml --------------------------------------------------------------------------------------------

# Declarations of mul_mv.metal the f16/bf16 mat-vec kernels need (matched on the declarator).
GGML_MV_KEEP = [
    r"\bhelper_mv_reduce_and_write\b",
    r"\bFC_mul_mv_\w+\s*\[\[",
    r"\bvoid kernel_mul_mv_t_t_impl\(", r"\bvoid kernel_mul_mv_t_t_disp\(", r"\bvoid kernel_mul_mv_t_t\(",
    r"\)\s*mul_mv_t_t;",
    r"\bvoid kernel_mul_mv_t_t_4_impl\(", r"\bvoid kernel_mul_mv_t_t_4_disp\(", r"\bvoid kernel_mul_mv_t_t_4\(",
    r"\)\s*mul_mv_t_t_4;",
    r"\bvoid kernel_mul_mv_ext_q4_f32_impl\(", r"\bvoid kernel_mul_mv_ext_q4_f32_disp\(",
    r"\)\s*mul_mv_ext_q4_f32_t;",
    r"\(kernel_mul_mv_disp_t\)", r"\(kernel_mul_mv2_disp_t\)", r"\bvoid mmv_fn\(", r"\)\s*mul_mv_disp_fn_t;",
    r"\bvoid kernel_mul_mv_id\(", r"\)\s*kernel_mul_mv_id_t;", r"\)\s*kernel_mul_mv_id_4_t;",
]
GGML_MV_HOSTS = ["kernel_mul_mv_f16_f32_4", "kernel_mul_mv_bf16_f32_4",
                 "kernel_mul_mv_ext_f16_f32_r1_4", "kernel_mul_mv_ext_bf16_f32_r1_4",
                 "kernel_mul_mv_id_f16_f32_4", "kernel_mul_mv_id_bf16_f32_4"]
# dequantize.h: the loaders the kept instantiations name (q8_0 only in ggml's typedef of the ext kernel).
GGML_DEQUANT_KEEP = [r"\bvoid dequantize_f16_t4\(", r"\bvoid dequantize_bf16_t4\(", r"\bvoid dequantize_q8_0_t4\("]

# Function constants as ggml's host sets them (ggml-metal-device.cpp). mul_mv and mul_mv_id for f16/bf16
# with K >= 384: nsg = min(4, (K + 127) / 128) = 4; ne12 = r2 = r3 = 1; split = false (their pipelines leave
# nxpsg unset: 8 only so that the ext instantiations the module also holds do not divide by zero).
# mul_mv_ext (3 to 8 rows, and 2 with K % 256 != 0): nsg = 2, nxpsg = 8.
GGML_MV = {"FC_mul_mv_nsg": 4, "FC_mul_mv_nxpsg": 8, "FC_mul_mv_ne12": 1, "FC_mul_mv_r2": 1, "FC_mul_mv_r3": 1,
           "FC_mul_mv_split": False}
GGML_MV_EXT = {**GGML_MV, "FC_mul_mv_nsg": 2}
GGML_DEFINES = ("GGML_METAL_HAS_BF16",)

# -- MLX ---------------------------------------------------------------------------------------------

# utils.h reduced to what gemv.h and softmax.h use (verbatim chunks); bf16_math.h, complex.h and logging.h
# are left out (gemv.h names complex64_t in a specialization no kernel here uses).
MLX_UTILS_KEEP = [r"#include \"mlx/backend/metal/kernels/(bf16|defines)\.h\"", r"#include <metal_math>",
                  r"#pragma once", r"\bfloat16_t;", r"^template <typename U>\s*struct Limits\b",
                  r"#define instantiate_float_limit", r"^instantiate_float_limit\(float\)",
                  r"#define MLX_MTL_PRAGMA_UNROLL", r"\bIdxT elem_to_loc\(", r"\bT ceildiv\("]
MLX_GEMV_INSTANCES = [
    # gemv (x @ W.T, W row-major): bm = 8 for N >= 4096, else 4 (matmul.cpp gemv_axbpy), sn = 32, tm = tn = 4.
    *(f"instantiate_gemv_helper({n}, {t}, {bm}, 1, 1, 32, 4, 4, 0, 0)" for bm in (8, 4)
      for n, t in (("float16", "half"), ("bfloat16", "bfloat16_t"))),
    # gather (MoE, one row per gathered vector): bm = 4 for N < 4096, else 8 (matmul.cpp gather_mv).
    *(f"instantiate_gemv_bs_helper({n}, {t}, {bm}, 1, 1, 32, 4, 4)" for bm in (4, 8)
      for n, t in (("float16", "half"), ("bfloat16", "bfloat16_t"))),
    # wide (2 to 15 rows on M3 and later, matmul.cpp gemv_wide_config): passes = (M + 4) / 5, vectors per
    # threadgroup ceil(M / passes), 32 K lanes for one pass; four rows: one pass of four.
    "instantiate_gemv_wide_helper(float16, half, 4, 32)",
    "instantiate_gemv_wide_helper(bfloat16, bfloat16_t, 4, 32)",
]
MLX_GEMV_CONSTANTS = {"gemv_wide_has_batch": False, "gemv_wide_do_axpby": False}
MLX_SOFTMAX_INSTANCES = ["instantiate_softmax(float32, float)", "instantiate_softmax_precise(float16, half)",
                         "instantiate_softmax_precise(bfloat16, bfloat16_t)"]

# -- translation -------------------------------------------------------------------------------------

# The most threads per threadgroup each peer's host launches a kernel with (None: bm x 32 of its name).
LAUNCH_BOUNDS = [
    (re.compile(r"kernel_mul_mv_ext_"), 64),
    (re.compile(r"kernel_mul_mv_"), 128),
    (re.compile(r"kernel_soft_max"), 256),  # nth <= 256 (ggml_metal_op_soft_max)
    (re.compile(r"gemv_(gather_)?(float16|bfloat16)_bm(\d+)"), None),
    (re.compile(r"gemv_wide_"), 128),
    (re.compile(r"(block|looped)_softmax"), 1024),
]
# Forms Apple's clang accepts and nvcc does not, as equivalents: a GNU range designator that zeroes a whole
# array (ggml: `float sumf[r1ptg] = { [ 0 ... r1ptg - 1 ] = 0.0f };`) is value-initialization; MLX's
# attribute spelling of the kernel qualifier (`[[kernel]]`, `[[kernel, max_total_threads_per_threadgroup(n)]]`)
# becomes the keyword.
SOURCE_FORMS = [(re.compile(r"\{\s*\[\s*0\s*\.\.\.\s*[^\]]+\]\s*=\s*0(?:\.0*)?f?\s*\}"), "{}"),
                (re.compile(r"\[\[\s*kernel\s*\]\]"), "kernel"),
                (re.compile(r"\[\[\s*kernel\s*,\s*"), "kernel [[")]


class PeerTranslator(CudaTranslator):
    """The project's translator, with the peers' [[threadgroup(0)]] parameters and MLX's long vectors."""

    renamed = {**CudaTranslator.renamed, **{f"{s}{n}": f"mtl_{s}{n}" for s in ("long", "ulong") for n in (2, 3, 4)}}
    headers = ("mtlcuda.h", "peer_ext.h")
    threadgroup_args = True

    @staticmethod
    def source_forms(text: str) -> str:
        for pattern, replacement in SOURCE_FORMS:
            text = pattern.sub(replacement, text)
        return text

    @staticmethod
    def launch_bound(host: str) -> int:
        for pattern, n in LAUNCH_BOUNDS:
            if m := pattern.match(host):
                return n if n is not None else int(m.group(3)) * 32
        return launch_bound(host)


def ggml_mv_source(peers: Path) -> str:
    """ggml's f16/bf16 mat-vec kernels: excerpts of ggml-common.h, dequantize.h and mul_mv.metal."""
    ggml = peers / "ggml"

    def keep_mv(text: str) -> bool:
        head = extract.head(text)
        if host := re.search(r'host_name\("([^"]+)"\)', head):
            return host.group(1) in GGML_MV_HOSTS
        return any(re.search(p, head) for p in GGML_MV_KEEP)

    common = (ggml / "ggml-common.h").read_text()
    metal_branch = next(i for i, l in enumerate(common.splitlines()) if "defined(GGML_COMMON_DECL_METAL)" in l)

    def keep_common(chunk) -> bool:  # the Metal branch's ggml_half, and block_q8_0 (named by a typedef)
        if metal_branch < chunk.line < metal_branch + 5 and "ggml_half;" in extract.head(chunk.text):
            return True
        return bool(re.search(r"#define QK8_0\b|\bblock_q8_0\b", extract.code(chunk.text)))

    kernels = ggml / "ggml-metal" / "kernels"
    return "\n".join([
        "// Excerpts of ggml-metal's mul_mv.metal (verbatim): tools/cuda_check/peer_sources.py.",
        '#include "common.h"',
        *(f'#line {c.line} "ggml-common.h"\n{c.text}\n' for c in extract.chunks(common) if keep_common(c)),
        extract.select(kernels / "dequantize.h",
                       lambda t: any(re.search(p, extract.head(t)) for p in GGML_DEQUANT_KEEP)),
        extract.select(kernels / "mul_mv.metal", keep_mv),
    ])


def mlx_utils(peers: Path) -> str:
    """MLX's utils.h reduced to MLX_UTILS_KEEP (the whole one needs headers these kernels do not)."""
    def keep(text: str) -> bool:
        return any(re.search(p, extract.head(text).strip(), re.M) for p in MLX_UTILS_KEEP)

    return "\n".join(["// Excerpts of MLX's utils.h (verbatim): tools/cuda_check/peer_sources.py.",
                      "struct complex64_t;  // named by gemv.h's DefaultAccT specialization only",
                      extract.select(peers / "mlx" / "kernels" / "utils.h", keep, "utils.h")])


def mlx_instantiations(metal: Path, instances: list[str]) -> str:
    """One of MLX's .metal files with its macros and only the wanted instantiations."""
    kept = [f'#line {ch.line} "{metal.name}"\n{ch.text}' for ch in extract.chunks(metal.read_text())
            if ch.text.startswith(("#define", "#include")) or "using namespace" in ch.text]
    return "\n".join(kept + instances) + "\n"


def modules(peers: Path, gen: Path) -> list[Module]:
    """The peers' modules; the sources made from excerpts are written into gen."""
    peers = peers.resolve()
    kernels = peers / "ggml" / "ggml-metal" / "kernels"
    mlx_root = gen / "mlx_include" / "mlx" / "backend" / "metal"
    overlay = gen / "mlx_overlay" / "mlx" / "backend" / "metal" / "kernels"
    for d in (mlx_root, overlay):
        d.mkdir(parents=True, exist_ok=True)
    if not (mlx_root / "kernels").exists():  # MLX's headers include each other by their repository paths
        (mlx_root / "kernels").symlink_to(peers / "mlx" / "kernels")
    write_if_changed(overlay / "utils.h", mlx_utils(peers))
    sources = {"ggml_mv.metal": ggml_mv_source(peers),
               "mlx_gemv.metal": mlx_instantiations(peers / "mlx" / "host" / "gemv.metal", MLX_GEMV_INSTANCES),
               "mlx_softmax.metal": mlx_instantiations(peers / "mlx" / "host" / "softmax.metal",
                                                       MLX_SOFTMAX_INSTANCES)}
    for name, text in sources.items():
        write_if_changed(gen / name, text)
    ggml_inc = [kernels, kernels.parent, peers / "ggml"]
    mlx_inc = [gen / "mlx_overlay", gen / "mlx_include"]

    def peer(name, source, include_dirs, constants=None, defines=()):
        return Module(name, source, include_dirs, constants, defines, PeerTranslator)

    return [peer("ggml_mv", gen / "ggml_mv.metal", ggml_inc, GGML_MV, GGML_DEFINES),
            peer("ggml_mv_ext", gen / "ggml_mv.metal", ggml_inc, GGML_MV_EXT, GGML_DEFINES),
            peer("ggml_softmax", kernels / "softmax.metal", ggml_inc, defines=GGML_DEFINES),
            peer("mlx_gemv", gen / "mlx_gemv.metal", mlx_inc, MLX_GEMV_CONSTANTS),
            peer("mlx_softmax", gen / "mlx_softmax.metal", mlx_inc)]
