"""The fiber context switch, on this CPU's assembly path and on the portable ucontext fallback."""

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("defines", [[], ["-DMTLSIM_UCONTEXT=1"]], ids=["native", "ucontext"])
def test_fibers(tmp_path, defines):
    exe = tmp_path / "fiber_test"
    runtime = ROOT / "csrc" / "sim" / "runtime"
    subprocess.run([os.environ.get("CXX", "c++"), "-std=c++17", "-O2", "-Wall", "-Wextra", "-Werror", *defines,
                    "-I", str(runtime), str(ROOT / "tests" / "cpp" / "fiber_test.cpp"), str(runtime / "fiber.cpp"),
                    "-o", str(exe)], check=True)
    assert subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.strip() == "OK"
