"""Tests of csrc/metal on the emulated Metal (tools/metal_emu), run by
tests/test_metal_emu.py in a process of their own: loading the emulation
makes ``mps`` the emulated GPU for the whole process. Collected only there
(MPS_EXT_METAL_EMU names the built module)."""

import os

import pytest

import emulation

collect_ignore_glob = [] if os.environ.get("MPS_EXT_METAL_EMU") else ["*.py"]


@pytest.fixture(scope="session")
def emu():
    """The loaded emulation (its hooks: fail_next_kernel, released_object_uses)."""
    return emulation.load()
