from pathlib import Path

import pytest

import mps_ext.sim
from mps_ext.testing import mps_usable

KERNELS = Path(__file__).parent / "kernels"


@pytest.fixture(scope="session")
def kernels():
    """Compiles tests/kernels/<name>.metal for the simulator (cached per session)."""
    cache = {}

    def get(name: str) -> mps_ext.sim.Library:
        if name not in cache:
            cache[name] = mps_ext.sim.compile_file(KERNELS / f"{name}.metal")
        return cache[name]

    return get


@pytest.fixture(scope="session")
def shader():
    """Compiles MSL source text for the simulator."""
    return mps_ext.sim.compile_shader


@pytest.fixture(params=["cpu", "mps"])
def device(request):
    """Runs a test on CPU tensors (the simulator) and on mps tensors (the GPU) when MPS really works here."""
    if request.param == "mps":
        usable, why = mps_usable()
        if not usable:
            pytest.skip(why)
    return request.param


def run_python(code: str, env: dict | None = None, timeout: float = 120, **popen):
    """Runs `code` in a fresh interpreter from the repository root (for what must start a new process:
    environment read once, crashes, hangs, signals); returns the CompletedProcess."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    full_env = {**os.environ, "PYTHONPATH": str(root), **(env or {})}
    return subprocess.run([sys.executable, "-c", code], cwd=root, env=full_env, capture_output=True, text=True,
                          timeout=timeout, **popen)
