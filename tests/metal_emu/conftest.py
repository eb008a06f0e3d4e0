"""Tests of csrc/metal on the emulated Metal (tools/metal_emu), run by
tests/test_metal_emu.py in a process of their own: loading the emulation
makes ``mps`` the emulated GPU for the whole process. Collected only there
(MPS_EXT_METAL_EMU names the built module)."""

import importlib.util
import os

import pytest

collect_ignore_glob = [] if os.environ.get("MPS_EXT_METAL_EMU") else ["*.py"]


@pytest.fixture(scope="session")
def emu():
    """The loaded emulation (its hooks: fail_next_kernel, released_object_uses)."""
    import mps_ext  # noqa: F401  (mps_ext._C first: the emulation links with it)

    spec = importlib.util.spec_from_file_location("_metal_emu", os.environ["MPS_EXT_METAL_EMU"])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
