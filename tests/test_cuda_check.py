"""The CUDA check's shim keeps up with the translator (tools/cuda_check), without a GPU.

The translator puts macros into the code it emits (MTLSIM_SPACE_ASSIGNMENT after every struct, forwarders
for members qualified with an address space); the shim must define each of them, or nvcc stops on the
first struct. When nvcc is on PATH, every translated file is compiled too.
"""

import importlib
import re
import shutil
import sys
from pathlib import Path

import pytest

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
    cubins = _tool("cuda").build([source], tmp_path, log=lambda *_: None)
    assert cubins[source.stem].stat().st_size > 0


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
