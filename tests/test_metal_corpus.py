"""Upstream Metal code, compiled as shipped and run against torch: ggml's
kernels (llama-cpp-python sdist), MLX's kernel headers (mlx-metal wheel; each
after utils.h and the other includes that MLX's own .metal files, which the
wheel does not carry, put before it), PyTorch's c10/metal headers (macOS
torch wheel) and the .metal files that other packages' wheels ship, pinned in
tools/metal_corpus.py.

CI fetches the corpus (.ci/run sets MPS_EXT_CORPUS=1); elsewhere the tests run
when it is cached and are skipped, saying how to get it, when it is not."""

import ctypes
import importlib.util
import os
import re
import sys
from pathlib import Path
from typing import NamedTuple

import pytest
import torch

import mps_ext
import mps_ext.sim
from mps_ext.sim import CompileError
from mps_ext.testing import assert_close

ROOT = Path(__file__).resolve().parent.parent


def _corpus_module():
    spec = importlib.util.spec_from_file_location("metal_corpus", ROOT / "tools" / "metal_corpus.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


corpus = _corpus_module()
if os.environ.get("MPS_EXT_CORPUS") == "1":
    corpus.fetch()
elif not corpus.available():
    pytest.skip("the upstream Metal corpus is not cached: MPS_EXT_CORPUS=1 fetches it (about 120 MB from PyPI; "
                "`python tools/metal_corpus.py --fetch` does it once)", allow_module_level=True)

ENTRIES = corpus.entries()


class Unsupported(NamedTuple):
    """Why a corpus file does not compile in the simulator, and a regular expression its compile error matches
    (with clang, as CI compiles)."""
    why: str
    error: str


# Corpus files that do not compile in the simulator (README "Supported MSL" has the same list). Each is a strict
# expected failure that must fail for its reason: a file that starts compiling, or fails for another reason,
# fails the test.
MPP = Unsupported("MSL 4: Metal Performance Primitives (tensor operations on <metal_tensor>), beyond the MSL 3.1 "
                  "and 3.2 the simulator targets",
                  r"'MetalPerformancePrimitives/MetalPerformancePrimitives\.h' file not found")
LAMBDAS = Unsupported("MSL 4: lambda expressions, beyond the MSL 3.1 and 3.2 the simulator targets",
                      r"MSL rule 'no lambdas': lambda expressions need MSL 4")
NOT_SUPPORTED = {f"mlx/{name}": MPP for name in (
    "gated_delta_nax_ops.h", "gated_delta_update_nax.h", "gated_delta_update_nax_vjp.h",
    "steel/attn/kernels/steel_attention_nax.h", "steel/attn/nax.h", "steel/gemm/gemm_nax.h", "steel/gemm/nax.h")}
NOT_SUPPORTED.update({f"mlx/{name}": LAMBDAS for name in (
    "fp_quantized_nax.h", "quantized_nax.h", "steel/gemm/kernels/steel_gemm_fused_nax.h",
    "steel/gemm/kernels/steel_gemm_gather_nax.h", "steel/gemm/kernels/steel_gemm_segmented_nax.h",
    "steel/gemm/kernels/steel_gemm_splitk_nax.h", "steel/gemm/kernels/steel_gemm_thin_nax.h")})
NOT_SUPPORTED["late-interaction-kernels/_maxsim.metal"] = Unsupported(
    "not MSL as shipped: a Python str.format template ({D_MAX} and doubled braces are filled in at run time)",
    r"undeclared identifier 'D_MAX'")
# MLX headers are compiled after utils.h and the other includes of the MLX .metal files that use them
# (tools/metal_corpus.py MLX_PRELUDES).
# Without clang the simulator erases address spaces, and overloads that differ only by them collide
# (MLX's complex.h): the list above is for the toolchain CI uses.
ERASED = "address spaces erased (no clang >= 18): overloads that differ only by address space collide"


def corpus_params():
    """Every corpus file, the unsupported ones marked as strict expected failures."""
    for entry in ENTRIES:
        expected = NOT_SUPPORTED.get(entry.name)
        marks = [pytest.mark.xfail(raises=CompileError, strict=True, reason=expected.why)] if expected else []
        yield pytest.param(entry, marks=marks, id=entry.name)


@pytest.mark.parametrize("entry", list(corpus_params()))
def test_corpus_file_compiles(entry):
    try:
        corpus.compile_entry(entry)
    except CompileError as e:
        if not mps_ext.sim.compiler.toolchain().address_spaces:
            pytest.xfail(ERASED)
        expected = NOT_SUPPORTED.get(entry.name)
        if expected and not re.search(expected.error, str(e)):
            pytest.fail(f"expected to fail with {expected.error!r} ({expected.why}), failed with:\n{e}")
        raise


MSL32 = corpus.msl32_entries(ENTRIES)


@pytest.mark.parametrize("entry", [pytest.param(e, id=e.name) for e in MSL32])
def test_corpus_file_compiles_under_msl32(entry):
    """The files that read differently when the source targets MSL 3.2 (tools/metal_corpus.py msl32_entries)
    compile under 3.2 too: MLX's logging.h takes <metal_logging>'s os_log there, which its users log with."""
    assert entry.name not in NOT_SUPPORTED
    corpus.compile_entry(entry, msl_version="3.2")


def test_msl32_entries_are_the_files_that_read_differently():
    assert [e.name for e in MSL32] == ["mlx/binary_ops.h", "mlx/indexing/masked_scatter.h", "mlx/logging.h"]


def test_every_corpus_file_is_accounted_for():
    names = {e.name for e in ENTRIES}
    assert len(names) >= 140
    assert set(NOT_SUPPORTED) <= names, "a listed file is no longer in the corpus"


# -- upstream kernels against torch --------------------------------------------------------------

class NormArgs(ctypes.Structure):  # ggml_metal_kargs_norm (ggml-metal-impl.h)
    _fields_ = [("ne00", ctypes.c_int32), ("ne00_t", ctypes.c_int32), ("nb1", ctypes.c_uint64),
                ("nb2", ctypes.c_uint64), ("nb3", ctypes.c_uint64), ("eps", ctypes.c_float),
                ("nef1", ctypes.c_int32 * 3), ("nef2", ctypes.c_int32 * 3), ("nef3", ctypes.c_int32 * 3),
                ("nbf1", ctypes.c_uint64 * 3), ("nbf2", ctypes.c_uint64 * 3), ("nbf3", ctypes.c_uint64 * 3),
                ("scale", ctypes.c_float)]


class BinArgs(ctypes.Structure):  # ggml_metal_kargs_bin
    _fields_ = [*((f"ne0{d}", ctypes.c_int32) for d in range(4)), *((f"nb0{d}", ctypes.c_uint64) for d in range(4)),
                *((f"ne1{d}", ctypes.c_int32) for d in range(4)), *((f"nb1{d}", ctypes.c_uint64) for d in range(4)),
                *((f"ne{d}", ctypes.c_int32) for d in range(4)), *((f"nb{d}", ctypes.c_uint64) for d in range(4)),
                ("offs", ctypes.c_uint64), ("o1", ctypes.c_uint64 * 8)]


class SumRowsArgs(ctypes.Structure):  # ggml_metal_kargs_sum_rows
    _fields_ = [*((f"ne0{d}", ctypes.c_int64) for d in range(4)), *((f"nb0{d}", ctypes.c_uint64) for d in range(4)),
                *((f"ne{d}", ctypes.c_int64) for d in range(4)), *((f"nb{d}", ctypes.c_uint64) for d in range(4))]


def _ggml(name: str, constants=None) -> mps_ext.sim.Library:
    entry = next(e for e in ENTRIES if e.name == f"ggml/{name}.metal")
    return mps_ext.sim.compile_file(entry.source, include_dirs=entry.include_dirs, constants=constants)


def _run(lib, kernel, buffers, groups, threads, threadgroup_lengths=()):
    with mps_ext.trace() as t:
        mps_ext.sim.dispatch(lib, kernel, buffers, groups, threads, threadgroup_lengths, grid_in_threads=False)
    assert [(k.name, k.backend) for k in t.kernels] == [(kernel, "simulator")]


@pytest.fixture(scope="module")
def rows():
    torch.manual_seed(0)
    x = torch.randn(7, 300)
    x[0, :5] = torch.tensor([1e-3, -50.0, 3.0, 0.0, 7.5])
    return x


@pytest.mark.parametrize("kernel,vec", [("kernel_rms_norm_f32", 1), ("kernel_rms_norm_f32_4", 4),
                                        ("kernel_norm_f32", 1), ("kernel_rms_norm_mul_f32", 1)])
def test_ggml_norms(rows, kernel, vec):
    lib = _ggml("norm", constants={"FC_norm_use_scale": False})
    n, m = rows.shape[1], rows.shape[0]
    weight = torch.rand(n) + 0.5
    args = NormArgs(ne00=n, ne00_t=n // vec, nb1=n * 4, nb2=m * n * 4, nb3=m * n * 4, eps=1e-6, scale=1.0)
    for k in range(3):
        args.nef1[k] = args.nef2[k] = args.nef3[k] = 1
        args.nbf1[k], args.nbf2[k], args.nbf3[k] = n * 4, m * n * 4, m * n * 4
    args.nef1[0] = m
    args.nbf1[1] = 0  # the weight row is broadcast over rows
    out = torch.full_like(rows, float("nan"))
    with mps_ext.sim.checked():
        _run(lib, kernel, [bytes(args), rows, weight, weight, out], (m, 1, 1), (128, 1, 1), [32 * 4])
    if "rms" in kernel:
        expected = torch.nn.functional.rms_norm(rows, (n,), eps=1e-6)
    else:
        expected = torch.nn.functional.layer_norm(rows, (n,), eps=1e-6)
    if "mul" in kernel:
        expected = expected * weight
    assert_close(out, expected, dtype=torch.float32)


@pytest.mark.parametrize("op,torch_op", [(0, torch.add), (1, torch.sub), (2, torch.mul), (3, torch.div)])
def test_ggml_binary_ops(rows, op, torch_op):
    lib = _ggml("binbcast", constants={"FC_bin_op": op, "FC_bin_f": 1, "FC_bin_rb": False, "FC_bin_cb": False})
    m, n = rows.shape
    other = torch.rand(1, n) + 0.5  # broadcast over rows, as ggml's ne11 = 1
    args = BinArgs(ne00=n, ne01=m, ne02=1, ne03=1, nb00=4, nb01=n * 4, nb02=m * n * 4, nb03=m * n * 4,
                   ne10=n, ne11=1, ne12=1, ne13=1, nb10=4, nb11=n * 4, nb12=n * 4, nb13=n * 4,
                   ne0=n, ne1=m, ne2=1, ne3=1, nb0=4, nb1=n * 4, nb2=m * n * 4, nb3=m * n * 4, offs=0)
    out = torch.full_like(rows, float("nan"))
    with mps_ext.sim.checked():
        _run(lib, "kernel_bin_fuse_f32_f32_f32", [bytes(args), rows, other, out], (m, 1, 1), (64, 1, 1))
    assert_close(out, torch_op(rows, other), dtype=torch.float32)


@pytest.mark.parametrize("op", ["sum", "mean"])
def test_ggml_sum_rows(rows, op):
    lib = _ggml("reduce", constants={"FC_sum_rows_op": 10 if op == "sum" else 11})  # OP_SUM_ROWS_NUM_*
    m, n = rows.shape
    args = SumRowsArgs(ne00=n, ne01=m, ne02=1, ne03=1, nb00=4, nb01=n * 4, nb02=m * n * 4, nb03=m * n * 4,
                       ne0=1, ne1=m, ne2=1, ne3=1, nb0=4, nb1=4, nb2=m * 4, nb3=m * 4)
    out = torch.full((m,), float("nan"))
    with mps_ext.sim.checked():
        _run(lib, "kernel_sum_rows_f32_f32", [bytes(args), rows, out], (m, 1, 1), (128, 1, 1), [32 * 4])
    assert_close(out, getattr(rows, op)(1), dtype=torch.float32)


class SoftMaxArgs(ctypes.Structure):  # ggml_metal_kargs_soft_max
    _fields_ = [*((f"ne0{d}", ctypes.c_int32) for d in range(3)), *((f"nb0{d}", ctypes.c_uint64) for d in (1, 2, 3)),
                *((f"ne1{d}", ctypes.c_int32) for d in (1, 2, 3)), *((f"nb1{d}", ctypes.c_uint64) for d in (1, 2, 3)),
                *((f"nb{d}", ctypes.c_uint64) for d in (1, 2, 3)),
                *((name, ctypes.c_float) for name in ("scale", "max_bias", "m0", "m1")),
                ("n_head_log2", ctypes.c_int32)]


@pytest.mark.parametrize("kernel", ["kernel_soft_max_f16", "kernel_soft_max_f32_4"])
def test_ggml_softmax(rows, kernel):
    """Scaled softmax over rows; the f16 kernel adds a half mask (attention's), the vectorized one has none."""
    lib = _ggml("softmax")
    m, n = rows.shape
    masked = "f16" in kernel
    mask = torch.randn(m, n).half()
    mask[:, ::7] = float("-inf")
    args = SoftMaxArgs(ne00=n, ne01=m, ne02=1, nb01=n * 4, nb02=m * n * 4, nb03=m * n * 4, ne11=m, ne12=1, ne13=1,
                       nb11=n * 2, nb12=m * n * 2, nb13=m * n * 2, nb1=n * 4, nb2=m * n * 4, nb3=m * n * 4,
                       scale=0.5, max_bias=0.0, m0=0.0, m1=0.0, n_head_log2=0)
    out = torch.full_like(rows, float("nan"))
    # src1 or src2 the same buffer as src0 means no mask or no attention sinks, as ggml binds them
    with mps_ext.sim.checked():
        _run(lib, kernel, [bytes(args), rows, mask if masked else rows, rows, out], (m, 1, 1), (64, 1, 1), [32 * 4])
    logits = rows * 0.5 + (mask.float() if masked else 0)
    assert_close(out, torch.softmax(logits, 1), dtype=torch.float32)


class UnaryArgs(ctypes.Structure):  # ggml_metal_kargs_unary
    _fields_ = [*((f"ne0{d}", ctypes.c_int32) for d in range(4)), *((f"nb0{d}", ctypes.c_uint64) for d in range(4)),
                *((f"ne{d}", ctypes.c_int32) for d in range(4)), *((f"nb{d}", ctypes.c_uint64) for d in range(4)),
                *((name, ctypes.c_float) for name in ("slope", "scale", "bias", "val", "min", "max"))]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("op,torch_op", [(103, lambda x: torch.nn.functional.gelu(x, approximate="tanh")),
                                         (106, torch.nn.functional.silu)])  # OP_UNARY_NUM_GELU, _SILU
def test_ggml_unary(rows, dtype, op, torch_op):
    lib = _ggml("unary", constants={"FC_unary_op": op, "FC_unary_cnt": False})
    x = rows.to(dtype)
    m, n = x.shape
    size = x.element_size()
    args = UnaryArgs(ne00=n, ne01=m, ne02=1, ne03=1, nb00=size, nb01=n * size, nb02=m * n * size, nb03=m * n * size,
                     ne0=n, ne1=m, ne2=1, ne3=1, nb0=size, nb1=n * size, nb2=m * n * size, nb3=m * n * size)
    out = torch.full_like(x, float("nan"))
    name = {torch.float32: "kernel_unary_f32_f32", torch.float16: "kernel_unary_f16_f16"}[dtype]
    per_row = -(-n // 64)  # threadgroups of 64 along a row
    with mps_ext.sim.checked():
        _run(lib, name, [bytes(args), x, out], (m * per_row, 1, 1), (64, 1, 1))
    assert_close(out, torch_op(x.float()), dtype=dtype)  # half kernels compute in float, as torch's reference


class MulMvArgs(ctypes.Structure):  # ggml_metal_kargs_mul_mv
    _fields_ = [*((f"ne0{d}", ctypes.c_int32) for d in range(3)), *((f"nb0{d}", ctypes.c_uint64) for d in range(4)),
                *((f"ne1{d}", ctypes.c_int32) for d in range(3)), *((f"nb1{d}", ctypes.c_uint64) for d in range(4)),
                ("ne0", ctypes.c_int32), ("ne1", ctypes.c_int32), ("nr0", ctypes.c_int32), ("r2", ctypes.c_int16),
                ("r3", ctypes.c_int16)]


def test_ggml_mul_mv_q8_0():
    """y @ W.T with W in ggml's q8_0 blocks (a half scale and 32 int8 quants each), 2 rows per threadgroup."""
    rows, k, vectors, simdgroups = 6, 256, 3, 4
    torch.manual_seed(1)
    w = torch.randn(rows, k // 32, 32)
    d = (w.abs().amax(2, keepdim=True) / 127).half()
    q = (w / d.float()).round().clamp(-127, 127).to(torch.int8)
    blocks = torch.cat([d.view(torch.uint8), q.view(torch.uint8)], 2).contiguous()  # rows x blocks x 34 bytes
    y = torch.randn(vectors, k)
    block_row = (k // 32) * 34
    args = MulMvArgs(ne00=k, ne01=rows, ne02=1, nb00=34, nb01=block_row, nb02=rows * block_row,
                     nb03=rows * block_row, ne10=k, ne11=vectors, ne12=1, nb10=4, nb11=k * 4, nb12=vectors * k * 4,
                     nb13=vectors * k * 4, ne0=rows, ne1=vectors, nr0=2, r2=1, r3=1)
    lib = _ggml("mul_mv", constants={"FC_mul_mv_nsg": simdgroups, "FC_mul_mv_nxpsg": 8, "FC_mul_mv_ne12": 1,
                                     "FC_mul_mv_r2": 1, "FC_mul_mv_r3": 1, "FC_mul_mv_split": False})
    out = torch.full((vectors, rows), float("nan"))
    with mps_ext.sim.checked():
        _run(lib, "kernel_mul_mv_q8_0_f32", [bytes(args), blocks, y, out], (rows // 2, vectors, 1),
             (32 * simdgroups, 1, 1), [2 * 32 * 4])
    weights = (d.float() * q.float()).reshape(rows, k)
    assert_close(out, y @ weights.T, dtype=torch.float32, scale=4)  # float sums in another order


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int32])
def test_mlx_arange(tmp_path, dtype):
    name = {torch.float32: "float", torch.float16: "half", torch.int32: "int"}[dtype]
    source = tmp_path / "arange.metal"
    source.write_text('#include <metal_stdlib>\nusing namespace metal;\n'
                      '#include "mlx/backend/metal/kernels/arange.h"\n'
                      f'template [[host_name("arange_{name}")]] [[kernel]] decltype(arange<{name}>) arange<{name}>;\n')
    lib = mps_ext.sim.compile_file(source, include_dirs=[corpus.mlx_dir()])
    out = torch.zeros(37, dtype=dtype)
    start, step = (3, 2) if dtype == torch.int32 else (0.5, 0.25)
    cast = {torch.float32: None, torch.float16: "fp16", torch.int32: "int32"}[dtype]
    with mps_ext.trace() as t, mps_ext.sim.checked():
        getattr(lib, f"arange_{name}")(start, step, out, arg_casts=cast)
    assert [k.name for k in t.kernels] == [f"arange_{name}"]
    assert torch.equal(out, torch.arange(37, dtype=torch.float64).mul(step).add(start).to(dtype))


def _mlx(tmp_path, name: str, headers, instantiations, msl_version="3.1") -> mps_ext.sim.Library:
    """MLX kernels instantiated as MLX's own .metal files do: utils.h, the headers, instantiate_kernel."""
    includes = "".join(f'#include "mlx/backend/metal/kernels/{h}"\n' for h in ("utils.h", *headers))
    source = tmp_path / f"{name}.metal"
    source.write_text(includes + "".join(f"instantiate_kernel({i})\n" for i in instantiations))
    return mps_ext.sim.compile_file(source, include_dirs=[corpus.mlx_dir()], msl_version=msl_version)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_mlx_unary(tmp_path, dtype):
    t = {torch.float32: "float", torch.float16: "half", torch.bfloat16: "bfloat16_t"}[dtype]
    ops = {"Exp": torch.exp, "Sigmoid": torch.sigmoid, "Tanh": torch.tanh, "Sqrt": torch.sqrt, "Abs": torch.abs}
    lib = _mlx(tmp_path, f"unary_{t}", ("unary_ops.h", "unary.h"),
               [f'"{op}", unary_v, {t}, {t}, {op}' for op in ops])
    x = torch.linspace(-4, 4, 101).to(dtype)
    x[7], x[11] = float("inf"), float("nan")
    n = x.numel()
    per_thread = 8 // x.element_size()  # WorkPerThread<T>
    for op, ref in ops.items():
        out = torch.full_like(x, 7)
        with mps_ext.trace() as tr, mps_ext.sim.checked():
            getattr(lib, op)(x, out, n, arg_casts="int32", threads=(n + per_thread - 1) // per_thread)
        assert [k.name for k in tr.kernels] == [op]
        assert_close(out, ref(x.float()).to(dtype), dtype=dtype)


@pytest.mark.parametrize("op,ref", [("Add", torch.add), ("Multiply", torch.mul), ("Divide", torch.div),
                                    ("Maximum", torch.maximum), ("Power", torch.pow)])
def test_mlx_binary(tmp_path, op, ref):
    lib = _mlx(tmp_path, f"binary_{op}", ("binary_ops.h", "binary.h"), [f'"vv_{op}", binary_vv, float, float, {op}'])
    torch.manual_seed(0)
    a, b = torch.rand(77) + 0.25, torch.randn(77)
    out = torch.full_like(a, 7)
    with mps_ext.trace() as tr, mps_ext.sim.checked():
        getattr(lib, f"vv_{op}")(a, b, out, 77, arg_casts={3: "int32"}, threads=39)
    assert [k.name for k in tr.kernels] == [f"vv_{op}"]
    assert_close(out, ref(a, b), dtype=torch.float32)


def test_mlx_integer_power_logs_under_msl32(tmp_path, capfd):
    """Under MSL 3.2 MLX's binary_ops.h logs a negative integer exponent through <metal_logging>'s os_log (its
    `constant mlx::os_log logger("mlx", "binary_ops")`) and returns 0."""
    lib = _mlx(tmp_path, "binary_power_int", ("binary_ops.h", "binary.h"), ['"vv_Power_int", binary_vv, int, int, Power'],
               msl_version="3.2")
    base = torch.tensor([2, -3, 5, 7, 0, -2, 4], dtype=torch.int32)
    exponent = torch.tensor([3, 2, -1, 0, 4, -2, 1], dtype=torch.int32)
    out = torch.full_like(base, 99)
    with mps_ext.trace() as tr:
        lib.vv_Power_int(base, exponent, out, 7, arg_casts={3: "int32"}, threads=4)
    assert tr.names == ["vv_Power_int"]
    negative = exponent < 0
    assert torch.equal(out, torch.where(negative, 0, torch.pow(base, exponent.clamp(min=0))))
    logged = sorted(re.findall(r"^os_log debug \[mlx:binary_ops\]: (.*?) — kernel 'vv_Power_int'",
                               capfd.readouterr().err, re.M))
    assert logged == sorted(f"int pow exp<0 (base={b} exp={e})" for b, e in zip(base[negative].tolist(),
                                                                                exponent[negative].tolist()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_mlx_softmax(tmp_path, dtype):
    t = {torch.float32: "float", torch.float16: "half"}[dtype]
    lib = _mlx(tmp_path, f"softmax_{t}", ("softmax.h",), [f'"softmax_{t}", softmax_single_row, {t}, float, 4'])
    torch.manual_seed(0)
    rows = (torch.randn(5, 300) * 4).to(dtype)
    rows[1, 3] = -float("inf")
    out = torch.full_like(rows, 7)
    with mps_ext.trace() as tr, mps_ext.sim.checked():
        mps_ext.sim.dispatch(lib, f"softmax_{t}", [rows, out, torch.tensor([300], dtype=torch.int32)], (5, 1, 1),
                             (96, 1, 1), grid_in_threads=False)  # ceil(300 / 4) threads, in whole SIMD groups
    assert [k.name for k in tr.kernels] == [f"softmax_{t}"]
    assert_close(out, torch.softmax(rows.float(), 1).to(dtype), dtype=dtype)


# PyTorch's own special functions for its MPS backend (c10/metal/special_math.h), each on inputs in its domain,
# against torch's CPU ones.
C10_SPECIAL = {
    "erf": (torch.special.erf, (-3, 3)), "erfc": (torch.special.erfc, (-3, 3)),
    "erfinv": (torch.special.erfinv, (-0.99, 0.99)), "i0": (torch.special.i0, (-10, 10)),
    "i0e": (torch.special.i0e, (-10, 10)), "i1": (torch.special.i1, (-10, 10)), "i1e": (torch.special.i1e, (-10, 10)),
    "log_gamma": (torch.special.gammaln, (0.1, 10)), "digamma": (torch.special.digamma, (0.1, 10)),
    "expm1f": (torch.special.expm1, (-3, 3)),
}


def test_c10_special_math(tmp_path):
    calls = "".join(f"  out[i * {len(C10_SPECIAL)} + {k}] = c10::metal::{name}(x[i * {len(C10_SPECIAL)} + {k}]);\n"
                    for k, name in enumerate(C10_SPECIAL))
    source = tmp_path / "c10_special.metal"
    source.write_text("#include <c10/metal/special_math.h>\nusing namespace metal;\n"
                      "kernel void special(device const float* x [[buffer(0)]], device float* out [[buffer(1)]],\n"
                      f"                    uint i [[thread_position_in_grid]]) {{\n{calls}}}\n")
    lib = mps_ext.sim.compile_file(source, include_dirs=[corpus.torch_include()])
    n = 101
    x = torch.stack([torch.linspace(low, high, n) for _, (low, high) in C10_SPECIAL.values()], 1)
    out = torch.full_like(x, float("nan"))
    with mps_ext.trace() as t, mps_ext.sim.checked():
        lib.special(x, out, threads=n)
    assert t.names == ["special"]
    expected = torch.stack([ref(x[:, k]) for k, (ref, _) in enumerate(C10_SPECIAL.values())], 1)
    assert_close(out, expected, dtype=torch.float32)  # a failure's column is the function's place in C10_SPECIAL


@pytest.mark.parametrize("kernel", ["fp8_to_half_kernel", "fp8_to_half_arithmetic_kernel"])
def test_fp4_fp8_for_torch_mps_e4m3_decode(kernel):
    """fp4-fp8-for-torch-mps's e4m3fn decodes (a constant half table, arithmetic) of all 256 codes."""
    entry = next(e for e in ENTRIES if e.name == "fp4-fp8-for-torch-mps/fp8_matmul.metal")
    lib = mps_ext.sim.compile_file(entry.source, include_dirs=entry.include_dirs)
    codes = torch.arange(256, dtype=torch.uint8)
    out = torch.empty(256, dtype=torch.float16)
    with mps_ext.trace() as t, mps_ext.sim.checked():
        getattr(lib, kernel)(codes, out, 256, threads=256, arg_casts="int32")
    assert t.names == [kernel]
    torch.testing.assert_close(out, codes.view(torch.float8_e4m3fn).half(), rtol=0, atol=0, equal_nan=True)
