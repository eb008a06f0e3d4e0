"""`python -m mps_ext info` and `python -m mps_ext selftest`."""

import subprocess
import sys


def run(*args):
    return subprocess.run([sys.executable, "-m", "mps_ext", *args], capture_output=True, text=True)


def test_info():
    import platform

    import torch

    import mps_ext
    from mps_ext.sim import compiler
    from mps_ext.testing import mps_usable

    p = run("info")
    assert p.returncode == 0, p.stderr
    info = {line[:12].strip(): line[13:] for line in p.stdout.splitlines()}  # "key" padded to 12, then the value
    from mps_ext._load import BUILT_WITH

    assert info["mps_ext"] == mps_ext.__version__
    assert info["torch"] == f"{torch.__version__} (mps_ext built against {BUILT_WITH})"
    assert info["python"] == platform.python_version()
    assert info["backends"].startswith("simulator")
    usable, why = mps_usable()
    assert info["mps device"] == ("usable" if usable else f"not usable: {why}")
    assert info["overrides"] == f"mps: {'on' if usable else 'off'}, cpu: off"
    tc = compiler.toolchain()
    assert info["simulator"].startswith(f"compiler {tc.cxx}, address spaces {'kept' if tc.address_spaces else 'erased'}")
    assert info["simulator"].endswith(f"cache {compiler.cache_dir()}")


def test_selftest_runs_every_check_kernel():
    p = run("selftest")
    assert p.returncode == 0, p.stdout + p.stderr
    for kernel in ("axpy", "block_sum", "matmul32", "histogram"):
        line = next(line for line in p.stdout.splitlines() if line.startswith(kernel))
        assert line.rstrip().endswith("ok"), line
    assert "all kernels match torch" in p.stdout
    # Every kernel of the build ran on the simulator, e.g. the long-row pair:
    assert "simulator  softmax split f32 (2, 5000)" in p.stdout
    assert "softmax_partials_float, softmax_finalize_float_float" in p.stdout
    assert "kernels no case ran" not in p.stdout
