"""Which compiler the simulator picks for kernels where no system clang is on
PATH: the ``ziglang`` package's clang (the ``strict`` extra), which keeps MSL's
address spaces, and otherwise the erased front end, with a note saying how to
get the strict one.

Each case runs in a process of its own whose PATH holds every program of this
one but the clangs. The ``ziglang`` package there is a stand-in that hands its
``c++`` command to this machine's clang: the real one builds zig's libc++ on
its first compile, minutes (tools/install_check.sh runs the real one)."""

import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mps_ext.sim import compiler

TOOLCHAIN = compiler.toolchain()

HEAD = "#include <metal_stdlib>\nusing namespace metal;\n"
KERNEL = HEAD + """
kernel void twice(device float* x [[buffer(0)]], uint i [[thread_position_in_grid]]) { x[i] *= 2; }
"""
# Metal rejects a threadgroup pointer to device memory; only a front end that keeps address spaces does too.
FORBIDDEN = HEAD + """
kernel void k(device float* d [[buffer(0)]]) {
  threadgroup float* p = d;
  p[0] = 1;
}
"""


def path_without_clang(links_root: Path) -> str:
    """This process's PATH with every clang* taken out: its directories that hold one are replaced by a
    directory (under ``links_root``) of links to their other programs."""
    kept = []
    for d in os.environ.get("PATH", "").split(os.pathsep):
        try:
            names = os.listdir(d)
        except OSError:
            continue
        if not any(n.startswith("clang") for n in names):
            kept.append(d)
            continue
        links = links_root / str(len(kept))
        links.mkdir(parents=True)
        for n in names:
            if not n.startswith("clang"):
                (links / n).symlink_to(os.path.join(d, n))
        kept.append(str(links))
    return os.pathsep.join(kept)


@pytest.fixture
def run_without_clang(tmp_path):
    """``run(code, pythonpath=None, **env)``: Python code in a process whose PATH holds no clang, with a
    simulator cache of its own."""
    environ = {k: v for k, v in os.environ.items() if k not in ("MPS_EXT_SIM_CXX", "MPS_EXT_SIM_ADDRESS_SPACES")}
    environ.update(PATH=path_without_clang(tmp_path / "path"), MPS_EXT_CACHE_DIR=str(tmp_path / "cache"))

    def run(code: str, pythonpath: Path | None = None, **env) -> subprocess.CompletedProcess:
        env = {**environ, **env}
        if pythonpath:
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(pythonpath), environ.get("PYTHONPATH")]))
        return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300,
                              cwd=tmp_path)

    return run


def ziglang_standin(tmp_path: Path, clang: str) -> Path:
    """A ``ziglang`` package whose ``python -m ziglang c++ ARGS`` runs ``clang ARGS``, logging each call."""
    site = tmp_path / "site"
    (site / "ziglang").mkdir(parents=True)
    (site / "ziglang" / "__init__.py").write_text("")
    (site / "ziglang" / "__main__.py").write_text(
        "import os, sys\n"
        "assert sys.argv[1] == 'c++', sys.argv\n"
        "with open(os.path.join(os.path.dirname(__file__), 'calls'), 'a') as f:\n"
        "    f.write(' '.join(sys.argv[2:]) + '\\n')\n"
        f"os.execv({clang!r}, [{clang!r}, *sys.argv[2:]])\n")
    return site


def system_clang() -> str | None:
    """The path of the system clang >= 18 that the simulator uses here, or None."""
    words = shlex.split(TOOLCHAIN.cxx)
    return shutil.which(words[0]) if TOOLCHAIN.address_spaces and len(words) == 1 else None


@pytest.mark.skipif(system_clang() is None, reason=f"no system clang >= 18 for the stand-in to run ({TOOLCHAIN.cxx})")
def test_without_a_system_clang_the_ziglang_clang_keeps_address_spaces(tmp_path, run_without_clang):
    site = ziglang_standin(tmp_path, system_clang())
    code = f"""
import torch, mps_ext.sim
from mps_ext.sim import compiler
tc = compiler.toolchain()
print(tc.cxx, tc.address_spaces, sep="\\n")
x = torch.arange(5.0)
mps_ext.sim.compile_shader({KERNEL!r}).twice(x, threads=5, group_size=5)
print(x.tolist())
try:
    mps_ext.sim.compile_shader({FORBIDDEN!r})
except compiler.CompileError as e:
    print("rejected:", "threadgroup float" in str(e))
"""
    p = run_without_clang(code, site, MPS_EXT_SIM_ADDRESS_SPACES="1")
    assert p.returncode == 0, p.stderr
    cxx, kept, result, rejected = p.stdout.splitlines()
    assert cxx == shlex.join([sys.executable, "-m", "ziglang", "c++"])
    assert kept == "True"
    assert result == "[0.0, 2.0, 4.0, 6.0, 8.0]"
    assert rejected == "rejected: True"
    # The probe, the kernel's compile and the rejected compile all went through the stand-in.
    calls = (site / "ziglang" / "calls").read_text()
    assert "-DMTLSIM_ADDRESS_SPACES=1" in calls and len(set(re.findall(r"shader-[\w-]+\.cpp", calls))) == 2


@pytest.mark.skipif(importlib.util.find_spec("ziglang") is not None, reason="ziglang is installed")
def test_without_any_clang_address_spaces_are_erased_and_the_note_names_the_strict_extra(run_without_clang):
    code = """
import os
from mps_ext.sim import compiler
tc = compiler.toolchain()
print(tc.address_spaces, tc.note, sep="\\n")
os.environ["MPS_EXT_SIM_ADDRESS_SPACES"] = "1"  # a missing clang is then an error
compiler.toolchain()
"""
    p = run_without_clang(code)
    assert p.returncode == 1
    kept, note = p.stdout.splitlines()
    assert kept == "False"
    assert 'pip install "mps_ext[strict]"' in note
    assert "CompileError: MPS_EXT_SIM_ADDRESS_SPACES=1 but no clang >= 18 found" in p.stderr
