"""The CUDA check (tools/cuda_check) keeps up with the translator and the host plans, without a GPU.

The translator puts macros into the code it emits (MTLSIM_SPACE_ASSIGNMENT after every struct, forwarders
for members qualified with an address space); the shim must define each of them, or nvcc stops on the
first struct. When nvcc is on PATH, every translated file is compiled too, to unoptimized PTX (whether
the translation compiles, in seconds; tools/cuda_check/run.py builds the cubins on the GPU machine). The
check's copy of the grouped, inverse and QR plans (ops.py) launches what csrc/ops launches in the simulator:
kernel, grid, threadgroup.
"""

import importlib
import re
import shutil
import sys
from pathlib import Path

import pytest
import torch

import mps_ext

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools" / "cuda_check"
SHIM = TOOL / "include" / "mtlcuda.h"
METAL = sorted((ROOT / "metal").glob("*.metal"))

# Every kind of member the translator forwards: an address-space-qualified method with and without a
# thread-space copy, a conversion, a conversion template.
SPACES_SOURCE = """
#include <metal_stdlib>
using namespace metal;
struct Pair {
  float a, b;
  float sum() const device { return a + b; }
  float sum() const thread { return a + b; }
  float first() const device { return a; }
  operator float() const device { return a; }
  template <typename U> operator U() const device { return U(b); }
};
kernel void pairs(device Pair* p [[buffer(0)]], device float* out [[buffer(1)]], uint i [[thread_position_in_grid]]) {
  out[i] = p[i].sum() + p[i].first() + float(p[i]) + int(p[i]);
  p[i] = Pair{out[i], 0.0f};
}
"""


def _tool(name: str):
    """A module of tools/cuda_check (its modules import each other by plain name)."""
    if str(TOOL) not in sys.path:
        sys.path.insert(0, str(TOOL))
    return importlib.import_module(name)


def _translate(path: Path) -> str:
    text, _ = _tool("translate_cuda").translate(path, [ROOT / "metal" / "include"])
    return text


def _used_macros(text: str) -> set[str]:
    return set(re.findall(r"\b(MTLSIM_\w+)\s*\(", text))


def _defined_macros() -> set[str]:
    return set(re.findall(r"^#define (MTLSIM_\w+)\(", SHIM.read_text(), re.M))


def test_shim_defines_every_macro_of_the_project_kernels():
    used = set().union(*(_used_macros(_translate(p)) for p in METAL))
    assert "MTLSIM_SPACE_ASSIGNMENT" in used
    assert used <= _defined_macros(), f"mtlcuda.h lacks {sorted(used - _defined_macros())}"


def test_shim_defines_every_forwarder_for_address_space_members(tmp_path):
    src = tmp_path / "spaces.metal"
    src.write_text(SPACES_SOURCE)
    used = _used_macros(_translate(src))
    assert {"MTLSIM_SPACE_METHOD", "MTLSIM_ERASED_SPACE_METHOD", "MTLSIM_SPACE_CONVERSION_TO",
            "MTLSIM_ERASED_SPACE_CONVERSION_TO", "MTLSIM_SPACE_CONVERSION_TEMPLATE"} <= used
    assert used <= _defined_macros(), f"mtlcuda.h lacks {sorted(used - _defined_macros())}"


def test_launcher_passes_metal_buffer_table():
    slots = int(re.search(r"kBufferSlots = (\d+);", SHIM.read_text()).group(1))
    assert slots == _tool("cuda").BUFFER_SLOTS == 31


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
@pytest.mark.parametrize("source", METAL + [TOOL / "planted.metal"], ids=lambda p: p.stem)
def test_nvcc_compiles_translation(source, tmp_path):
    built = _tool("cuda").build([source], tmp_path, log=lambda *_: None, check_only=True)
    assert built[source.stem].stat().st_size > 0


def _experts(e, n, k, block, seed):
    """e4m3fn experts (E, n, k) and their scales: per channel, or per block of block_size."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(e, n, k, generator=g).to(torch.float8_e4m3fn)
    shape = (e, n) if block is None else (e, -(-n // block[0]), -(-k // block[1]))
    return w, torch.rand(shape, generator=g) + 0.5


def _offs(ends):
    return torch.tensor(ends, dtype=torch.int32)


# name: (the kernel it runs, ends per expert, n, k, block_size): decode with 2, 4 and 8 rows per run (K split in
# two for the 4), tiles of 16, 32 and 64 rows, and blocks along K that are not a multiple of 16 (tiled however few
# the rows).
FP8_PLANS = {
    "decode, 1 row per expert": ("decode_m2", [1, 2, 2, 4], 24, 520, (16, 32)),
    "decode, K split": ("decode_m4", [3, 3, 10, 14, 20], 40, 2100, None),
    "decode, 7 rows per expert": ("decode_m8", [5, 12, 21], 40, 300, (16, 128)),
    "prefill, 12 rows per expert": ("tiled_m16", [10, 30, 44, 50], 33, 40, (16, 24)),
    "prefill, 26 rows per expert": ("tiled_m32", [20, 50, 80], 33, 72, None),
    "prefill, 75 rows per expert": ("tiled_m64", [0, 150], 40, 36, (32, 16)),
    "decode, blocks of 24 along K": ("tiled_m16", [2, 5, 5, 11], 40, 48, (16, 24)),
}


def _launched(call) -> list[tuple]:
    with mps_ext.trace() as t:
        call()
    return [(k.name, k.grid, k.threadgroup) for k in t.kernels]


def _planned(launches) -> list[tuple]:
    pad = lambda v: tuple(v) + (1,) * (3 - len(v))
    return [(l.kernel, pad(l.grid), pad(l.threads)) for l in launches]


@pytest.fixture
def ops(monkeypatch):
    """tools/cuda_check/ops.py with its buffers on the CPU (its plans need no GPU)."""
    monkeypatch.setattr(_tool("cuda"), "DEV", "cpu")
    return _tool("ops")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", FP8_PLANS, ids=str)
def test_fp8_grouped_mm_plans_are_the_hosts(ops, case, dtype):
    kernel, ends, n, k, block = FP8_PLANS[case]
    w, scale = _experts(len(ends), n, k, block, seed=len(ends))
    x, offs = torch.randn(ends[-1], k).to(dtype), _offs(ends)
    launches, out = ops.fp8_grouped_mm(x, w, scale, offs, block)
    ran = _launched(lambda: mps_ext.fp8_grouped_mm(x, w, scale, offs, block_size=block))
    assert _planned(launches) == ran
    assert [name for name, _, _ in ran] == [f"fp8_grouped_mm_{kernel}_{ops.METAL_TYPE[dtype]}"]
    assert out.shape == (ends[-1], n)


GROUPED_PLANS = {  # (a, b, offs) of grouped_mm's modes, sharing the plan code with fp8_grouped_mm
    "decode": lambda: (torch.randn(9, 48), torch.randn(4, 24, 48).transpose(1, 2), _offs([2, 2, 7, 9])),
    "decode_kn": lambda: (torch.randn(9, 48), torch.randn(4, 48, 24), _offs([2, 2, 7, 9])),
    "tiled rows": lambda: (torch.randn(80, 40), torch.randn(3, 33, 40).transpose(1, 2), _offs([20, 50, 80])),
    "batched": lambda: (torch.randn(3, 20, 24), torch.randn(3, 40, 24).transpose(1, 2), None),
}


@pytest.mark.parametrize("case", GROUPED_PLANS, ids=str)
def test_grouped_mm_plans_are_the_hosts(ops, case):
    a, b, offs = GROUPED_PLANS[case]()
    launches, _ = ops.grouped_mm(a, b, offs)
    assert _planned(launches) == _launched(lambda: mps_ext.grouped_mm(a, b, offs))


@pytest.mark.parametrize("n", [3, 9])
def test_inverse_plans_are_the_hosts(ops, n):
    A = torch.randn(5, n, n) + n * torch.eye(n)
    launches, (X, _) = ops.inverse(A)
    assert _planned(launches) == _launched(lambda: mps_ext.inv_ex(A))
    assert X.stride() == torch.linalg.inv(A).stride()


@pytest.mark.parametrize("mode", ["reduced", "complete", "r"])
def test_qr_plans_are_the_hosts(ops, mode):
    A = torch.randn(3, 7, 5, dtype=torch.complex64)
    launches, (Q, _) = ops.qr(A, mode)
    assert _planned(launches) == _launched(lambda: mps_ext.qr(A, mode))
    if Q is not None:
        assert Q.stride() == torch.linalg.qr(A, mode)[0].stride()


UNROLL_SOURCE = """
#include <metal_stdlib>
#include "mps_ext/unroll.h"
using namespace metal;
kernel void sums(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  float acc[4];
  MPS_EXT_UNROLL
  for (uint j = 0; j < 4; ++j) acc[j] = float(i + j);
  #pragma unroll 2
  for (uint j = 0; j < 4; ++j) acc[j] *= 2.0f;
  #pragma clang loop unroll(disable)
  for (uint j = 1; j < 4; ++j) acc[0] += acc[j];
  out[i] = acc[0];
}
"""


def test_loop_unroll_hints_reach_nvcc(tmp_path):
    # A rolled loop over a tile puts the tile on the stack; Apple's compiler unrolls where the source says so,
    # and so must the CUDA translation.
    src = tmp_path / "unroll.metal"
    src.write_text(UNROLL_SOURCE)
    text = _translate(src)
    hints = re.findall(r"^(#pragma [^\n]*)\n#line \d+ [^\n]*\n\s*for\b", text, re.M)
    assert hints == ["#pragma unroll", "#pragma unroll (2)", "#pragma unroll 1"], text
