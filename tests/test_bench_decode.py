"""benchmarks/bench_decode.py without a Mac: its case list is the CUDA check's peer tool's, it lists them and
exits cleanly without an Apple GPU, and each case's calls (small, on CPU tensors: ours in the simulator,
torch's own CPU op as theirs) compute the same thing, ours through our kernels and theirs through torch's."""

import dataclasses
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import mps_ext
from mps_ext import bench
from mps_ext.testing import assert_close_normwise, mps_usable

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "bench_decode.py"
TOOL = ROOT / "tools" / "cuda_check"
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
decode = bench.load("bench_decode")


def run_script(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=ENV, timeout=120)


def test_lists_the_cases_of_the_peer_tool():
    if str(TOOL) not in sys.path:
        sys.path.insert(0, str(TOOL))
    peer_cases = importlib.import_module("peer_cases")
    p = run_script("--list")
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == [f"{c.family} {c.name}" for c in peer_cases.cases()
                                     if c.family in decode.FAMILIES]
    assert len(p.stdout.splitlines()) == 60
    p = run_script("--list", "--families", "fp8", "softmax")
    assert p.stdout.splitlines()[0] == "fp8 q_proj m=1" and p.stdout.splitlines()[-1] == "softmax 256x4096 bf16"
    assert len(p.stdout.splitlines()) == 18


@pytest.mark.skipif(mps_usable()[0], reason="a usable Apple GPU runs the benchmark")
def test_without_mps_says_so_and_exits_cleanly():
    p = run_script("--families", "gemv")
    assert p.returncode == 0, p.stderr
    assert "needs an Apple-silicon GPU" in p.stdout and "Nothing to measure here" in p.stdout


def test_bad_family_is_an_argument_error():
    p = run_script("--families", "gemm")
    assert p.returncode == 2 and "argument --families: invalid choice: 'gemm'" in p.stderr


def _small(case):
    """The case at a size the simulator runs in a blink, keeping its rows, tokens and dtype."""
    dims = {"gemv": lambda n, k, m: (96, 512, m), "fp8": lambda n, k, m: (96, 512, m),
            "moe": lambda e, topk, op, n, k, t: (8, 2, op, 48, 384, min(t, 4)),
            "moe_fp8": lambda e, topk, op, n, k, t: (8, 2, op, 48, 384, min(t, 4)),
            "moe_kn": lambda e, topk, op, n, k, t: (8, 2, op, 40, 64, t),
            "softmax": lambda rows, cols: (min(rows, 3), min(cols, 4096))}[case.family](*case.dims)
    return dataclasses.replace(case, dims=dims)


SMALL = list({(c.family, c.dims, c.dtype): c for c in map(_small, decode.cases())}.values())
# What the kernels ours dispatches are named like, and our bf16 kernel's of the FP8 families.
KERNEL = {"gemv": "gemv_", "fp8": "fp8_linear_", "moe": "grouped_mm_", "moe_fp8": "fp8_grouped_mm_",
          "moe_kn": "grouped_mm_decode_kn_", "softmax": "softmax_"}
BF16_KERNEL = {"fp8": "gemv_", "moe_fp8": "grouped_mm_"}


@pytest.mark.parametrize("case", SMALL, ids=lambda c: f"{c.family} {c.dims} {c.dtype}".replace(" ", "_"))
def test_each_case_runs_our_kernel_against_torchs_op(case):
    calls = decode.CALLS[case.family](case, "cpu")
    with mps_ext.trace() as torch_side:
        want = calls.theirs()
    with mps_ext.trace() as ours:
        got = calls.ours()
    assert not torch_side.kernels  # theirs is torch's own op: the overrides are off on the CPU
    assert ours.kernels and all(k.name.startswith(KERNEL[case.family]) for k in ours.kernels), ours.names
    assert got.dtype == want.dtype == case.dtype
    assert_close_normwise(got, want)
    if case.family in BF16_KERNEL:
        with mps_ext.trace() as bf16:
            same = calls.bf16()
        assert bf16.kernels and all(k.name.startswith(BF16_KERNEL[case.family]) for k in bf16.kernels), bf16.names
        assert_close_normwise(same, want)
    else:
        assert calls.bf16 is None


@pytest.mark.parametrize("family", list(KERNEL))
def test_calls_rotate_through_input_sets_that_move_the_rotation_bytes(family, monkeypatch):
    # Small cases get several input sets (a weight read from the system-level cache would time its
    # bandwidth); each call takes the next, ours and torch's in step, and the cycle comes back to the first.
    case = next(c for c in SMALL if c.family == family)
    monkeypatch.setattr(decode, "ROTATE_BYTES", 3 * decode.CALLS[family](case, "cpu").moved - 1)
    calls = decode.rotating(case, "cpu")
    with mps_ext.trace() as ours:
        got = [calls.ours() for _ in range(4)]
    want = [calls.theirs() for _ in range(4)]
    assert len(ours.kernels) >= 4 and all(k.name.startswith(KERNEL[family]) for k in ours.kernels)
    for g, w in zip(got, want):
        assert_close_normwise(g, w)
    assert not torch.equal(got[0], got[1]) and not torch.equal(got[1], got[2]) and torch.equal(got[3], got[0])
    if calls.bf16:
        for w in want:
            assert_close_normwise(calls.bf16(), w)
