"""Builds and runs tests/cpp/values_test.cpp, the test of the simulator's MSL
value types and math library (csrc/sim/include/mtlsim/{scalar,vec,math}.h)."""

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from mps_ext.sim import compiler

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "tests" / "cpp" / "values_test.cpp"
CXX = shlex.split(os.environ.get("CXX", "c++"))
COMMON = ["-std=c++17", "-Wall", "-Wextra", "-Werror", "-I", str(ROOT / "csrc" / "sim" / "include")]

BUILDS = {
    "O1": ["-O1"],
    "O2-no-contract": ["-O2", "-ffp-contract=off"],
    # The software half conversions that compilers without _Float16 use.
    "soft-half": ["-O1", "-DMTLSIM_SOFT_HALF"],
}


@pytest.mark.parametrize("flags", BUILDS.values(), ids=BUILDS.keys())
def test_values(tmp_path, flags):
    if shutil.which(CXX[0]) is None:
        pytest.skip(f"no C++ compiler {CXX[0]!r}")
    build_and_run(tmp_path, [*CXX, *COMMON, *flags])


def test_values_with_address_spaces(tmp_path):
    """The same checks, built as compile_shader builds kernels when clang keeps address spaces as types."""
    toolchain = compiler.toolchain()
    if not toolchain.address_spaces:
        pytest.skip(f"address spaces erased: {toolchain.note}")
    flags = [f for f in COMMON if not f.startswith("-std=")]
    build_and_run(tmp_path, [toolchain.cxx, *flags, *compiler.ADDRESS_SPACE_FLAGS, "-O1"])


def build_and_run(tmp_path, command):
    binary = tmp_path / "values_test"
    build = subprocess.run([*command, str(SOURCE), "-o", str(binary)], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    run = subprocess.run([str(binary)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.strip().endswith("OK"), run.stdout + run.stderr
