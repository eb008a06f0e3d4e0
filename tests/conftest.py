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
