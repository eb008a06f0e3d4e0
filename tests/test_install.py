"""Installing like a torch package: the torch an isolated build compiles against,
what `import mps_ext` says when the installed torch is not the one it was built
against, and the benchmarks of an installed package."""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import mps_ext

ROOT = Path(__file__).resolve().parent.parent


def build_backend():
    spec = importlib.util.spec_from_file_location("build_backend", ROOT / "tools" / "build_backend.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_isolated_build_asks_for_the_installed_torch():
    # As pip runs the hook in an isolated build: this environment's Python, with
    # PYTHONPATH and PYTHONNOUSERSITE hiding its packages.
    code = "import build_backend; print(build_backend.get_requires_for_build_wheel()[0])"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "tools"), "PYTHONNOUSERSITE": "1"}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == f"torch=={torch.__version__.split('+')[0]}"


@pytest.mark.parametrize("installed, wanted", [("2.14.1+cpu", "torch==2.14.1"), ("2.12.0", "torch>=2.13,<2.16"),
                                               ("2.16.0", "torch>=2.13,<2.16"), (None, "torch>=2.13,<2.16")])
def test_build_requirement_is_a_supported_installed_torch_else_the_range(monkeypatch, installed, wanted):
    backend = build_backend()
    monkeypatch.setattr(backend, "installed_torch", lambda: installed and installed.split("+")[0])
    assert backend.torch_requirement() == wanted


def test_the_build_records_its_torch():
    from mps_ext import _build

    assert _build.TORCH == torch.__version__


def test_import_with_another_torch_names_both_and_the_fix():
    # The record of a build against another torch release, in place of this one's.
    code = ("import sys, types; b = types.ModuleType('mps_ext._build'); b.TORCH = '2.99.0'; "
            "sys.modules['mps_ext._build'] = b; import mps_ext")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 1
    assert (f"ImportError: mps_ext was built against torch 2.99.0, but torch {torch.__version__} is installed"
            in p.stderr)
    assert "pip install --no-build-isolation . (with build isolation" in p.stderr


def test_installed_package_runs_the_benchmarks(tmp_path):
    # The Python part as a wheel lays it out (setup.py build_py), with this build's _C: no checkout on the path.
    lib = tmp_path / "lib"
    p = subprocess.run([sys.executable, "setup.py", "-q", "build_py", "--build-lib", str(lib)], cwd=ROOT,
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    shutil.copy(mps_ext._C.__file__, lib / "mps_ext")
    env = {**os.environ, "PYTHONPATH": str(lib)}
    out = tmp_path / "out"
    p = subprocess.run([sys.executable, "-m", "mps_ext", "bench", "--ops", "simulator", "--repeat", "1", "--out",
                        str(out)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert json.loads((out / "bench.json").read_text())["benchmarks"]["simulator"]["rows"]
