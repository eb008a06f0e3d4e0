"""The Metal backend (csrc/metal/*.mm) on the emulated Metal of tools/metal_emu,
built as for each torch MPS runtime the emulation models (2.13, 2.14, 2.15).

The emulation's tests (tests/metal_emu/) run in a process of their own,
since loading the emulation makes ``mps`` its GPU for the whole process."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HERE = ROOT / "tests" / "metal_emu"


def load_build():
    spec = importlib.util.spec_from_file_location("metal_emu_build", ROOT / "tools" / "metal_emu" / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build = load_build()


@pytest.mark.parametrize("runtime", build.RUNTIMES)
def test_the_metal_layer_on_the_emulated_gpu(runtime):
    if absent := build.missing():
        pytest.skip(f"the emulated Metal needs {', '.join(absent)} (./run and .ci/run install them with apt)")
    env = {**os.environ, "MPS_EXT_METAL_EMU": str(build.build(runtime))}
    # The runtimes differ in streams, events and errors only: every other test (kernels, limits) runs under
    # the installed one.
    tests = HERE if runtime == build.installed() else HERE / "test_streams.py"
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                             "--confcutdir", str(HERE), str(tests)], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=600)  # its own conftest only (--confcutdir), not this suite's
    assert result.returncode == 0, result.stdout[-20000:] + result.stderr[-5000:]
