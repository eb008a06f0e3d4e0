"""`python -m mps_ext info` and `python -m mps_ext selftest`."""

import subprocess
import sys


def run(*args):
    return subprocess.run([sys.executable, "-m", "mps_ext", *args], capture_output=True, text=True)


def test_info():
    p = run("info")
    assert p.returncode == 0, p.stderr
    for key in ("mps_ext", "torch", "mps device", "simulator"):
        assert key in p.stdout


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
