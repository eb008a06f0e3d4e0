"""`python -m mps_ext bench`: what it writes on a machine without a usable Apple GPU (the simulator benchmark
only), the Markdown and plot of GPU results, and its arguments."""

import dataclasses
import importlib.util
import os
import json
import subprocess
import sys
from pathlib import Path

import pytest

from mps_ext import bench
from mps_ext.testing import mps_usable

ROOT = Path(__file__).resolve().parent.parent
# Subprocesses import this checkout (and what PYTHONPATH already adds).
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def run_cli(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "mps_ext", "bench", *args], capture_output=True, text=True,
                          cwd=cwd, env=ENV, timeout=300)


@pytest.mark.skipif(mps_usable()[0], reason="a usable Apple GPU runs the GPU benchmarks instead")
def test_without_mps_runs_the_simulator_benchmark_and_writes_json_markdown(tmp_path):
    p = run_cli("--out", str(tmp_path), "--repeat", "1")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "No usable Apple GPU here" in p.stdout
    assert "softmax, linear, fp8, grouped_mm, linalg, pad, upsample, dropout, attention, decode" in p.stdout  # which ones it skipped
    report = json.loads((tmp_path / "bench.json").read_text())
    env = report["environment"]
    assert env["chip"] is None and env["peak_gbps"] is None and env["macos"] is None
    assert env["torch"] == __import__("torch").__version__ and env["mps"].startswith("not usable")
    assert list(report["benchmarks"]) == ["simulator"]
    sim = report["benchmarks"]["simulator"]
    assert sim["device"] == "cpu (simulator)"
    cases = [r["case"] for r in sim["rows"]]
    assert cases == ["softmax 1x151936 fp32", "softmax 8x32000 fp32", "gemv 4096x4096 float", "gemv 4096x4096 half",
                     "lu 1000 x 16x16 fp32"]
    for r in sim["rows"]:
        assert r["simulator_ms"] > 0 and r["torch_cpu_ms"] > 0
        assert r["speedup"] == pytest.approx(r["torch_cpu_ms"] / r["simulator_ms"])
    md = (tmp_path / "bench.md").read_text()
    assert "| chip | — |" in md and f"| torch | {env['torch']} |" in md and "| macOS | — |" in md
    assert "| case | simulator ms | torch cpu ms | slowdown |" in md
    assert md.count("\n| softmax ") == 2 and "| gemv 4096x4096 half |" in md
    has_matplotlib = importlib.util.find_spec("matplotlib") is not None
    assert (tmp_path / "bench.png").exists() == has_matplotlib
    assert ("no plot: matplotlib is not installed" in p.stdout) != has_matplotlib


def test_unknown_op_is_an_error(tmp_path):
    p = run_cli("--ops", "softmax,gemm", "--out", str(tmp_path))
    assert p.returncode == 2
    assert "unknown gemm" in p.stderr
    assert not (tmp_path / "bench.json").exists()


def gpu_report():
    """A report as a Mac writes it (two rows of the linear benchmark), for the Markdown and plot writers."""
    env = bench.environment("Apple M3 Max", 400, True, "")
    rows = [{"case": "Llama 3 8B q_proj 1x4096x4096", "model": "Llama 3 8B", "layer": "q_proj", "rows": 1,
             "shape": "4096x4096", "torch_us": 120.0, "mps_ext_us": 100.0, "speedup": 1.2, "gbps": 335.7,
             "pct_peak": 83.9, "kernels": "gemv_dense_m1_bfloat"},
            {"case": "Llama 3 8B q_proj 4x4096x4096", "model": "Llama 3 8B", "layer": "q_proj", "rows": 4,
             "shape": "4096x4096", "torch_us": 100.0, "mps_ext_us": 125.0, "speedup": 0.8, "gbps": None,
             "pct_peak": None, "kernels": "gemv_dense_m4_bfloat"}]
    columns = [dataclasses.asdict(c) for c in bench.load("bench_linear").COLUMNS]
    return {"environment": env,
            "benchmarks": {"linear": {"title": "F.linear", "device": "mps", "columns": columns, "rows": rows}}}


def test_markdown_of_gpu_results():
    md = bench.markdown(gpu_report())
    assert "| chip | Apple M3 Max |" in md and "| peak bandwidth used for % peak (GB/s) | 400 |" in md
    assert "| model | layer | rows | n x k | torch µs | mps_ext µs | GB/s | % peak | speedup | kernel |" in md
    assert "| Llama 3 8B | q_proj | 1 | 4096x4096 | 120.0 | 100.0 | 335.7 | 83.9 | 1.20 | gemv_dense_m1_bfloat |" in md
    assert "| 100.0 | 125.0 | — | — | 0.80 |" in md  # unknown values are dashes
    assert "Geometric-mean speedup over torch: 0.98x" in md


def test_plot_of_gpu_results(tmp_path):
    pytest.importorskip("matplotlib")
    assert bench.plot(gpu_report(), tmp_path / "bench.png")
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
