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

- Attention: ggml's bf16 flash_attn_ext_vec with its reduction (excerpts of fa_vec_f16.metal, fa_aux.metal,
  fa_vec_common.metal whole) and, for prefill, its simdgroup-matrix flash_attn_ext with the mask's block map
  (excerpts of fa_f16.metal, fa_aux.metal, fa_common.metal whole); MLX's sdpa_vector.h and, for prefill,
  steel_attention.h whole, with the instantiations of its scaled_dot_product_attention.metal and
  steel_attention.metal; one module per set of function constants the hosts choose for the cases of
  benchmarks/_attention_cases.py (attention_modules).

All of it goes through the project's translator and shim (translate_cuda.py, include/mtlcuda.h), plus
include/peer_ext.h for what only the peers use.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import peer_extract as extract
import peer_plans
from cuda import Module
from generate_sources import write_if_changed
from translate_cuda import ROOT, CudaTranslator, launch_bound

sys.path.insert(0, str(ROOT / "benchmarks"))
import _attention_cases  # noqa: E402 (the attention cases, whose host plans choose the attention modules)

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
# Limits<half> and Limits<bfloat16_t> (utils.h's instantiate_float_limit) as float constants of the same values:
# the shim's half and bfloat are storage types without constexpr constructors. The attention kernels compare
# masks with them and start running maxima from finite_min.
MLX_SMALL_LIMITS = """
template <> struct Limits<half> {
  static constexpr constant float max = INFINITY, min = -INFINITY, finite_max = 65504.0f, finite_min = -65504.0f;
};
template <> struct Limits<bfloat16_t> {
  static constexpr constant float max = INFINITY, min = -INFINITY, finite_max = 3.38953139e38f,
                                  finite_min = -3.38953139e38f;
};
"""
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

# -- attention ---------------------------------------------------------------------------------------

# dequantize.h: the bf16 loaders of the flash-attention kernels (4 elements for vec, 4x4 for the other), and
# the f16 ones their typedefs name.
GGML_FA_DEQUANT_KEEP = {True: [r"\bvoid dequantize_f16_t4\(", r"\bvoid dequantize_bf16_t4\("],
                        False: [r"\bvoid dequantize_f16\(", r"\bvoid dequantize_bf16\("]}
# fa_vec_f16.metal / fa_f16.metal: the type lists and typedef the instantiations use (the instantiations
# themselves are chosen by host name).
GGML_FA_KEEP = [r"#define FA_TYPES\b", r"#define FA_TYPES_BF\b", r"\)\s*flash_attn_ext_vec_t\s*;",
                r"\)\s*flash_attn_ext_t\s*;"]
# fa_aux.metal: the vec kernels' reduction and the prefill kernel's mask map, with their function constants.
GGML_FA_VEC_AUX = [r"\bFC_flash_attn_ext_vec_reduce_\w+\s*\[\[", r"\bvoid kernel_flash_attn_ext_vec_reduce\("]
GGML_FA_AUX = [r"\bFC_flash_attn_ext_blk_\w+\s*\[\[", r"\bvoid kernel_flash_attn_ext_blk\("]
# MLX: the instantiations of scaled_dot_product_attention.metal and steel_attention.metal (mlx/host's commit)
# for what the host picks, in MLX's own instantiate_kernel (defines.h); steel's template takes the value head
# dim (BV) after BD in these kernel headers, the head dim itself here.
MLX_SDPA_VECTOR = 'instantiate_kernel("sdpa_vector_{t}_{d}_{v}", sdpa_vector, {t}, {d}, {v})'
MLX_SDPA_2PASS = ['instantiate_kernel("sdpa_vector_2pass_1_{t}_{d}_{v}", sdpa_vector_2pass_1, {t}, {d}, {v})',
                  'instantiate_kernel("sdpa_vector_2pass_2_{t}_{v}", sdpa_vector_2pass_2, {t}, {v})']
MLX_STEEL = ('instantiate_kernel("steel_attention_{n}_bq32_bk{bk}_bd{d}_wm4_wn1_mask{n}", attention, {t}, 32, {bk}, '
             '{d}, {d}, 4, 1, {t}, float)')


def ggml_fa_source(peers: Path, hosts: list[str], vec: bool) -> str:
    """ggml's flash-attention kernels of the given host names: vec (fa_vec_common.metal, with its reduction) or
    the simdgroup-matrix kernel (fa_common.metal, with the mask map), excerpts of the files that instantiate
    them."""
    kernels = peers / "ggml" / "ggml-metal" / "kernels"

    def keeper(patterns, by_host=False):
        def keep(text: str) -> bool:
            head = extract.head(text)
            if host := re.search(r'host_name\(\s*"([^"]+)"\s*\)', head):
                return by_host and host.group(1) in hosts
            return any(re.search(p, head) for p in patterns)
        return keep

    common = "fa_vec_common.metal" if vec else "fa_common.metal"
    return "\n".join([
        f"// Excerpts of ggml-metal's flash-attention kernels (verbatim): tools/cuda_check/peer_sources.py.",
        '#include "common.h"',
        extract.select(kernels / "dequantize.h", keeper(GGML_FA_DEQUANT_KEEP[vec])),
        f'#include "{common}"',
        extract.select(kernels / ("fa_vec_f16.metal" if vec else "fa_f16.metal"), keeper(GGML_FA_KEEP, by_host=True)),
        extract.select(kernels / "fa_aux.metal", keeper(GGML_FA_VEC_AUX if vec else GGML_FA_AUX)),
    ])


def attention_modules(peers: Path, gen: Path, ggml_inc: list[Path], mlx_inc: list[Path]) -> list[Module]:
    """The peers' attention modules: one per set of function constants that their hosts choose for the cases
    of benchmarks/_attention_cases.py (peer_plans' routing), each with the instantiations those cases launch."""
    wanted: dict[str, tuple] = {}  # module: (kind, constants, instantiations or host names)

    def want(name, kind, constants, *items):
        wanted.setdefault(name, (kind, constants, []))[2].extend(i for i in items if i not in wanted[name][2])

    t, n = "bfloat16_t", "bfloat16"
    for case in _attention_cases.cases():
        heads, kv_heads, dim, v_dim, sinks, _, q_len, keys, causal = case.dims
        route = peer_plans.mlx_attention_route(heads, kv_heads, dim, v_dim, q_len, keys)
        if route[0] in ("vector", "2pass"):
            blocks = route[1] if route[0] == "2pass" else peer_plans.mlx_sdpa_blocks(1, 0)
            constants = {"has_mask": False, "query_transposed": False, "do_causal": causal and q_len > 1,
                         "bool_mask": False, "float_mask": False, "has_sinks": sinks, "blocks": blocks}
            forms = [MLX_SDPA_VECTOR] if route[0] == "vector" else MLX_SDPA_2PASS
            want(peer_plans.mlx_sdpa_module(blocks, sinks), "mlx_sdpa", constants,
                 *(f.format(t=t, d=dim, v=v_dim) for f in forms))
        elif route[0] == "steel" and route[0] in peer_plans.MLX_TRANSLATED:
            constants = {"align_Q": True, "align_K": True, "has_mask": False, "do_causal": causal,
                         "has_sinks": sinks, "save_lse": False}
            want("mlx_steel" + ("_sinks" if sinks else ""), "mlx_steel", constants,
                 MLX_STEEL.format(n=n, t=t, bk=route[1], d=dim))
        vec = peer_plans.ggml_fa_use_vec(dim, q_len)
        if peer_plans.ggml_attention_unsupported(dim, v_dim, q_len):
            continue
        name = peer_plans.ggml_fa_module(dim, v_dim, sinks, keys, vec)
        if vec:
            constants = {"FC_flash_attn_ext_vec_has_mask": False, "FC_flash_attn_ext_vec_has_sinks": sinks,
                         "FC_flash_attn_ext_vec_has_bias": False, "FC_flash_attn_ext_vec_has_scap": False,
                         "FC_flash_attn_ext_vec_has_kvpad": False, "FC_flash_attn_ext_vec_has_sparse": False,
                         "FC_flash_attn_ext_vec_ns10": dim, "FC_flash_attn_ext_vec_ns20": v_dim,
                         "FC_flash_attn_ext_vec_nsg": peer_plans.ggml_fa_vec_nsg(keys),
                         "FC_flash_attn_ext_vec_nwg": peer_plans.GGML_FA_VEC_NWG,
                         "FC_flash_attn_ext_vec_reduce_DV": v_dim,
                         "FC_flash_attn_ext_vec_reduce_NWG": peer_plans.GGML_FA_VEC_NWG}
            want(name, "ggml_fa_vec", constants, f"kernel_flash_attn_ext_vec_bf16_dk{dim}_dv{v_dim}")
        else:
            constants = {"FC_flash_attn_ext_has_mask": causal, "FC_flash_attn_ext_has_sinks": sinks,
                         "FC_flash_attn_ext_has_bias": False, "FC_flash_attn_ext_has_scap": False,
                         "FC_flash_attn_ext_has_kvpad": False, "FC_flash_attn_ext_bc_mask": False,
                         "FC_flash_attn_ext_ns10": dim, "FC_flash_attn_ext_ns20": v_dim,
                         "FC_flash_attn_ext_nsg": 8 if dim >= 512 else 4,
                         "FC_flash_attn_ext_blk_nqptg": peer_plans.GGML_FA_NQPTG,
                         "FC_flash_attn_ext_blk_ncpsg": peer_plans.GGML_FA_NCPSG}
            want(name, "ggml_fa", constants, f"kernel_flash_attn_ext_bf16_dk{dim}_dv{v_dim}")
    sdpa = peers / "mlx" / "kernels"
    headers = {"mlx_sdpa": [sdpa / "sdpa_vector.h"], "mlx_steel": [sdpa / "steel" / "attn" / "kernels" / "steel_attention.h"]}
    out = []
    for name, (kind, constants, items) in wanted.items():
        if kind.startswith("mlx"):
            text = "\n".join(["// MLX's attention kernels, instantiated as its host names them: "
                               "tools/cuda_check/peer_sources.py.",
                               '#include "mlx/backend/metal/kernels/utils.h"',
                               *(f'#include "mlx/backend/metal/kernels/{h.relative_to(sdpa)}"' for h in headers[kind]),
                               "using namespace metal;", *items, ""])
            include = mlx_inc
        else:
            text, include = ggml_fa_source(peers, items, vec=kind == "ggml_fa_vec"), ggml_inc
        write_if_changed(gen / f"{name}.metal", text)
        out.append(Module(name, gen / f"{name}.metal", include, constants,
                          GGML_DEFINES if kind.startswith("ggml") else (), PeerTranslator))
    return out


# -- translation -------------------------------------------------------------------------------------

# The most threads per threadgroup each peer's host launches a kernel with (None: bm x 32 of its name).
LAUNCH_BOUNDS = [
    (re.compile(r"kernel_mul_mv_ext_"), 64),
    (re.compile(r"kernel_mul_mv_"), 128),
    (re.compile(r"kernel_soft_max"), 256),  # nth <= 256 (ggml_metal_op_soft_max)
    (re.compile(r"gemv_(gather_)?(float16|bfloat16)_bm(\d+)"), None),
    (re.compile(r"gemv_wide_"), 128),
    (re.compile(r"(block|looped)_softmax"), 1024),
    (re.compile(r"kernel_flash_attn_ext_vec_reduce"), 1024),  # 32 x nwg
    (re.compile(r"kernel_flash_attn_ext_blk"), 32),
    (re.compile(r"kernel_flash_attn_ext_"), 128),  # 32 x nsg, nsg <= 4 below head dim 512
    (re.compile(r"sdpa_vector_"), 1024),  # 1024, or 32 x GQA factor x query rows <= 1024 (has_fused_kernel)
    (re.compile(r"steel_attention_"), 128),  # 32 x WM x WN
]
# Forms Apple's clang accepts and nvcc does not, as equivalents: a GNU range designator that zeroes a whole
# array (ggml: `float sumf[r1ptg] = { [ 0 ... r1ptg - 1 ] = 0.0f };`) is value-initialization; MLX's
# attribute spelling of the kernel qualifier (`[[kernel]]`, `[[kernel, max_total_threads_per_threadgroup(n)]]`)
# becomes the keyword. One that fills a whole array with another value (ggml's prefill attention: `float M[NQ] =
# { [0 ... NQ-1] = -FLT_MAX/2 };`) is the declaration and a loop storing the value. A function-like macro in an
# unroll count (ggml: `#pragma unroll (MIN(DK8/2, 4*NSG))`, which Apple's clang expands and nvcc does not)
# becomes MIN's expansion (common.h's). Specializations of a template on each address space of a pointer (MLX's
# pointer_element<device T*>, <threadgroup T*>, ...) are one type once the spaces are erased: the thread one
# stays.
SOURCE_FORMS = [(re.compile(r"\{\s*\[\s*0\s*\.\.\.\s*[^\]]+\]\s*=\s*0(?:\.0*)?f?\s*\}"), "{}"),
                (re.compile(r"(\w+)\s+(\w+)\s*\[\s*(\w+)\s*\]\s*=\s*\{\s*\[\s*0\s*\.\.\.\s*\3\s*-\s*1\s*\]\s*=\s*"
                            r"([^{};]+?)\s*\}\s*;"),
                 r"\1 \2[\3]; for (int mtlcuda_i = 0; mtlcuda_i < \3; ++mtlcuda_i) \2[mtlcuda_i] = \4;"),
                (re.compile(r"^(#pragma\s+unroll\s*\()\s*MIN\s*\(([^,()]+),([^()]+)\)\s*\)", re.M),
                 r"\1((\2) < (\3) ? (\2) : (\3)))"),
                (re.compile(r"template\s*<\s*typename\s+(\w+)\s*>\s*struct\s+\w+\s*<\s*(?:device|constant|threadgroup)\s+"
                            r"(?:const\s+)?\1\s*\*\s*>\s*\{[^{}]*\}\s*;"), ""),
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

    def emit_cuda(self) -> str:
        # Apple's placement of simdgroup-matrix elements over the lanes (include/mtlcuda.h): MLX's MMA tiles read
        # and write them through thread_elements().
        first, rest = super().emit_cuda().split("\n", 1)
        return f"{first}\n#define MTLCUDA_APPLE_MATRIX_LANES 1\n{rest}"

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
                      extract.select(peers / "mlx" / "kernels" / "utils.h", keep, "utils.h"), MLX_SMALL_LIMITS])


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

    return [*attention_modules(peers, gen, ggml_inc, mlx_inc),
            peer("ggml_mv", gen / "ggml_mv.metal", ggml_inc, GGML_MV, GGML_DEFINES),
            peer("ggml_mv_ext", gen / "ggml_mv.metal", ggml_inc, GGML_MV_EXT, GGML_DEFINES),
            peer("ggml_softmax", kernels / "softmax.metal", ggml_inc, defines=GGML_DEFINES),
            peer("mlx_gemv", gen / "mlx_gemv.metal", mlx_inc, MLX_GEMV_CONSTANTS),
            peer("mlx_softmax", gen / "mlx_softmax.metal", mlx_inc)]
