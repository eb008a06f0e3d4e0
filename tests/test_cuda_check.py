"""The CUDA check (tools/cuda_check) keeps up with the translator and the host plans, without a GPU.

The translator puts macros into the code it emits (MTLSIM_SPACE_ASSIGNMENT after every struct, forwarders
for members qualified with an address space); the shim must define each of them, or nvcc stops on the
first struct. When nvcc is on PATH, every translated file is compiled too, to unoptimized PTX (whether
the translation compiles, in seconds; tools/cuda_check/run.py builds the cubins on the GPU machine). The
check replays the host's own recorded plans (replay.py): its whole small sweep, run in the simulator instead,
passes every check.
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


@pytest.fixture
def on_cpu(monkeypatch):
    """The check's modules with DEV the CPU: recordings bound to the recorded tensors themselves."""
    for name in ("cuda", "replay", "cases"):
        monkeypatch.setattr(_tool(name), "DEV", "cpu")


def test_every_small_case_passes_its_check_with_the_recording_run_in_the_simulator(on_cpu):
    # The host's plans, recorded by every case of the sweep, run in the simulator: each check (float64
    # reference, outputs poisoned first) passes, so on CUDA a failure is the translation's or the GPU's; and
    # the sweep launches every kernel, so the sanitizers see each one.
    assert _tool("run").dry_run(["softmax", "gemv", "fp8", "grouped_mm", "linalg", "pad", "upsample", "dropout",
                                   "attention"]) == ([], [])


def test_replay_binds_each_storage_once_at_the_recorded_offsets(on_cpu):
    x = torch.randn(3 * 5003 + 1)[1:].view(3, 5003)  # 4 bytes into its storage
    recording, y = _tool("replay").record(mps_ext.softmax, x, -1)
    replay = _tool("replay").Replay(recording)
    partials, finalize = replay.launches
    assert [partials.kernel, finalize.kernel] == ["softmax_partials_float", "softmax_finalize_float_float"]
    assert partials.addresses[0] == finalize.addresses[0] != x.data_ptr()  # one copy of x, on DEV
    assert torch.equal(partials.buffers[0], x.view(torch.uint8).flatten())  # bound at x's offset
    assert partials.addresses[1] == finalize.addresses[1]  # the partial sums one launch writes, the next reads
    assert bytes(partials.buffers[2].tolist()) == recording.launches[0].args[2]  # the parameter struct
    finalize.buffers[2].fill_(0x3F)  # what a kernel would write into the output
    replay.download()
    assert torch.equal(y.view(torch.uint8), finalize.buffers[2].view(y.shape[0], -1))


@pytest.mark.fallback("rows > 8")
def test_recording_an_op_that_goes_to_torch_raises(on_cpu):
    with pytest.raises(RuntimeError, match="mps_ext::linear left the call to torch"):
        _tool("replay").record(mps_ext.linear, torch.randn(9, 8), torch.randn(4, 8))  # 9 rows: torch's


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


def test_sanitizer_reports_of_torchs_own_kernels_are_not_attributed_to_ours():
    # A case checks our output against torch's op on the GPU (cuDNN's attention, say) right after our launch.
    run = _tool("run")
    log = "\n".join([
        run.MARK + "dropout_backward_bfloat",
        run.MARK + run.TORCH,
        "========= Error: Potential RAW hazard detected at __shared__ 0x470 in block (0,0,0) :",
        run.MARK + "planted_race",
        "========= Error: Potential RAW hazard detected at __shared__ 0x604 in block (0,0,0) :",
        run.MARK + "__end__",
        "========= Error: Potential WAR hazard detected at __shared__ 0x608 in block (0,0,0) :",
    ])
    found = run.parse_sanitizer(log)
    assert found == {"dropout_backward_bfloat": [], "planted_race": [
        "========= Error: Potential RAW hazard detected at __shared__ 0x604 in block (0,0,0) :",
        "========= Error: Potential WAR hazard detected at __shared__ 0x608 in block (0,0,0) :"]}
