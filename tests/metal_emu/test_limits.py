"""A Mac's limits on the emulated device and pipelines: 32 KiB of threadgroup
memory, and a pipeline's staticThreadgroupMemoryLength as its kernel declares
it plus what shader validation adds (MPS_EXT_METAL_EMU_VALIDATION_THREADGROUP_BYTES,
read once per process: each case runs in a process of its own)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import mps_ext

from mps_ext.testing import assert_close

# lu_factor_ex of a complex64 matrix through lu_factor_simd_float2, whose
# threadgroup memory is exactly 32 KiB.
FACTOR = """
import json, sys, torch, emulation
emulation.load()
import mps_ext
with mps_ext.trace() as t:
    factors = [r.cpu() for r in mps_ext.lu_factor_ex(torch.load(sys.argv[1], weights_only=True).to("mps"))]
torch.save(factors, sys.argv[2])
reasons = [r for s in mps_ext.overrides.stats().values() for r in s["reasons"]]
print(json.dumps({"kernels": [k.name for k in t.kernels], "fallbacks": reasons}))
"""


@pytest.mark.parametrize("validation_bytes, runs", [(0, True), (16, False)])
def test_a_pipeline_over_the_gpus_threadgroup_memory_is_left_to_torch(tmp_path, validation_bytes, runs):
    a = torch.randn(40, 40, dtype=torch.complex64, generator=torch.Generator().manual_seed(0))
    torch.save(a, tmp_path / "a.pt")
    env = {**os.environ, "MPS_EXT_METAL_EMU_VALIDATION_THREADGROUP_BYTES": str(validation_bytes),
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, "-c", FACTOR, str(tmp_path / "a.pt"), str(tmp_path / "out.pt")],
                            env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.splitlines()[-1])
    lu, pivots, info = torch.load(tmp_path / "out.pt", weights_only=True)
    want_lu, want_pivots, _ = torch.linalg.lu_factor_ex(a)
    assert_close(lu, want_lu, scale=40)
    assert torch.equal(pivots, want_pivots) and int(info) == 0
    if runs:
        assert report == {"kernels": ["lu_factor_simd_float2"], "fallbacks": []}
    else:
        assert report["kernels"] == []
        assert report["fallbacks"] == ["kernel 'lu_factor_simd_float2' needs 32784 bytes of threadgroup memory; "
                                       "this GPU has 32768"], report


def test_device_info_where_torch_has_no_core_count(emu):
    # torch's MPSDevice::getCoreCount throws where IOKit has no gpu-core-count: `python -m mps_ext info` reports
    # the count dispatch sizes for (the architecture's smallest chip) instead of failing.
    emu.set_core_count_fails(True)
    try:
        info = dict(emu.device_info())
    finally:
        emu.set_core_count_fails(False)
    assert int(info["gpu cores"]) > 0 and info["name"]


# softmax twice in a fresh process, its library's first compile failing.
COMPILE = """
import json, sys, torch, emulation
emu = emulation.load()
import mps_ext
x = torch.randn(4, 300).to("mps")
emu.fail_next_compiles("emulated compile failure", 1, sys.argv[1] == "compile error")
runs = []
for _ in range(2):
    with mps_ext.trace() as t:
        y = mps_ext.softmax(x, -1)
    runs.append([k.name for k in t.kernels])
    torch.testing.assert_close(y.cpu(), torch.softmax(x.cpu(), -1))
reasons = [r for s in mps_ext.overrides.stats().values() for r in s["reasons"]]
print(json.dumps({"runs": runs, "fallbacks": reasons}))
"""


@pytest.mark.parametrize("failure", ["compile error", "compiler service"])
def test_only_compile_errors_are_remembered(failure):
    # A compile error recurs on the same source: the family falls back to torch from then on, compiled once. The
    # compiler service's own failure (interrupted, timed out) need not: the next call compiles again and runs.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, "-c", COMPILE, failure], env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.splitlines()[-1])
    assert report["runs"][0] == [] and any("emulated compile failure" in r for r in report["fallbacks"]), report
    assert report["runs"][1] == ([] if failure == "compile error" else [report["runs"][1][0]]), report
    assert failure == "compile error" or report["runs"][1][0].startswith("softmax"), report


# softmax on a GPU of the kind the environment sets (the emulation reads it once, at start).
GPU_KIND = """
import json, torch, emulation
emu = emulation.load()
import mps_ext
x = torch.randn(4, 300)
with mps_ext.trace() as t:
    y = mps_ext.softmax(x.to("mps"), -1)
torch.testing.assert_close(y.cpu(), torch.softmax(x, -1))
reasons = [r for s in mps_ext.overrides.stats().values() for r in s["reasons"]]
print(json.dumps({"metal": mps_ext._C._has_metal(), "unavailable": mps_ext._C._metal_unavailable(),
                  "kernels": [k.name for k in t.kernels], "fallbacks": reasons}))
"""


@pytest.mark.parametrize("family, width", [(0, 64), (9, 64), (9, 32)])
def test_only_apple_gpus_run_the_kernels(family, width):
    # The kernels are written for Apple GPUs (Apple7 on, SIMD groups of 32): an Intel Mac's AMD GPU (no Apple
    # family, SIMD groups of 64) gets no Metal backend, saying why, and a pipeline of another SIMD width is
    # refused: torch computes those ops, never the kernels with wrong results.
    env = {**os.environ, "MPS_EXT_METAL_EMU_APPLE_FAMILY": str(family), "MPS_EXT_METAL_EMU_SIMD_WIDTH": str(width),
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, "-c", GPU_KIND], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.splitlines()[-1])
    assert report["metal"] == (family >= 7) and ("Apple7" in report["unavailable"]) == (family < 7), report
    assert bool(report["kernels"]) == (family >= 7 and width == 32), report
    if family >= 7 and width != 32:
        assert any("SIMD groups of 64 threads" in r for r in report["fallbacks"]), report
