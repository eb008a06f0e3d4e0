"""The fiber context switch: this CPU's assembly, the portable ucontext
fallback, and the aarch64 assembly that Apple silicon uses (run under
qemu-user; .ci/run installs the cross compiler and qemu)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RUNTIME = ROOT / "csrc" / "sim" / "runtime"
SOURCES = [str(ROOT / "tests" / "cpp" / "fiber_test.cpp"), str(RUNTIME / "fiber.cpp")]
FLAGS = ["-std=c++17", "-O2", "-Wall", "-Wextra", "-Werror", "-I", str(RUNTIME)]


def build_and_run(compiler: list[str], exe: Path, runner: list[str] = ()):
    subprocess.run([*compiler, *FLAGS, *SOURCES, "-o", str(exe)], check=True)
    result = subprocess.run([*runner, str(exe)], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "OK"


@pytest.mark.parametrize("defines", [[], pytest.param(["-DMTLSIM_UCONTEXT=1"], marks=pytest.mark.skipif(
    sys.platform == "darwin", reason="macOS deprecates ucontext and never uses the fallback"))],
    ids=["native", "ucontext"])
def test_fibers(tmp_path, defines):
    build_and_run([os.environ.get("CXX", "c++"), *defines], tmp_path / "fiber_test")


def test_fibers_aarch64(tmp_path):
    cross, qemu = shutil.which("aarch64-linux-gnu-g++"), shutil.which("qemu-aarch64")
    if not (cross and qemu):
        pytest.skip("needs aarch64-linux-gnu-g++ and qemu-aarch64 (Debian: g++-aarch64-linux-gnu qemu-user)")
    build_and_run([cross, "-static"], tmp_path / "fiber_test_aarch64", [qemu])
