"""The torch-mps peer of tools/cuda_check/peers.py (peer_torch.py) without a GPU: torch 2.15's softmax routing on
known shapes, its launches on the simulator against torch's own op, the table column, and with nvcc on PATH
that its translation compiles. torch's sources come from MPS_EXT_TORCH_MPS (or build/peer_sources/torch)."""

import importlib
import os
import shutil
import sys
import warnings
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools" / "cuda_check"
SOURCES = Path(os.environ.get("MPS_EXT_TORCH_MPS", ROOT / "build" / "peer_sources" / "torch"))
needs_sources = pytest.mark.skipif(not (SOURCES / "c10" / "metal").is_dir(), reason="no torch sources")


def _tool(name: str):
    if str(TOOL) not in sys.path:
        sys.path.insert(0, str(TOOL))
    return importlib.import_module(name)


@pytest.fixture
def peer_torch(monkeypatch):
    for name in ("cuda", "replay"):
        monkeypatch.setattr(_tool(name), "DEV", "cpu")
    return _tool("peer_torch")


def test_softmax_routing_is_torch_2_15s(peer_torch):
    # softmax_mps_impl: softmax_row to 1024 columns (2048 from 128 rows on), else 512 threadgroups' worth of
    # chunks no shorter than 2048 (75 for one 151,936-long row), else the 2D fallback.
    route = peer_torch.softmax_route
    assert route(1, 151936) == ("split", 75, 2026)
    assert route(64, 151936) == ("split", 8, 18992)
    assert route(256, 4096) == ("split", 2, 2048)
    assert route(4096, 128) == route(16384, 64) == route(1, 1024) == route(128, 2048) == ("row",)
    assert route(127, 2048) == ("general",) == route(512, 4096)


@needs_sources
def test_softmax_launches_match_torch_on_the_simulator(peer_torch):
    # The launches peer_torch plans (kernel, grid, threads, SoftmaxParams bytes) run torch's SoftMax.metal in the
    # simulator and give torch's softmax, on every route the cases take.
    sim = pytest.importorskip("mps_ext.sim")
    source = (SOURCES / peer_torch.KERNELS / "SoftMax.metal").read_text()
    lib = sim.compile_shader("#define __METAL__ 1\n" + source, name="torch_softmax.metal",
                             include_dirs=[str(SOURCES), str(SOURCES / "aten" / "src")])
    for rows, cols, dtype in [(3, 128, torch.float32), (2, 64, torch.bfloat16), (1, 9000, torch.float32),
                              (4, 5000, torch.bfloat16)]:
        x = (torch.randn(rows, cols) * 3).to(dtype)
        y = torch.full_like(x, float("nan"))
        for l in peer_torch.softmax(x, y, peer_torch.softmax_partials_buffer(x)):
            buffers = [bytes(b.numpy()) if b.dtype == torch.uint8 else b for b in l.buffers]
            with warnings.catch_warnings():
                # torch's threadgroup_max/sum (c10/metal/reduction_utils.h) reduce the SIMD groups' partials in a
                # SIMD-group function that only the first lanes reach: torch's code, reported, not ours to fix.
                warnings.simplefilter("ignore", sim.DivergenceWarning)
                sim.dispatch(lib, l.kernel.split("/")[1], buffers, l.grid, l.threads, grid_in_threads=False)
        want = torch.softmax(x.double(), -1)
        assert ((y.double() - want).norm() / want.norm()).item() < (1e-6 if dtype == torch.float32 else 4e-3)


def test_column_only_with_torch_sources(peer_torch):
    report = _tool("peer_report")
    base = {"ours": {"ok": True, "us": [10.0, 10.0], "bytes": 1}, "mlx": {"ok": True, "us": [12.0, 12.0], "bytes": 1}}
    info = {"device": "H100", "sms": 132, "torch": "2.13", "cuda": "13.0", "copy_gbs": 3000.0}
    without = report.render({"info": info, "cases": [{"family": "softmax", "name": "1x151936 bf16", "impls": base}]})
    assert "torch-mps" not in without
    impls = {**base, "torch_mps": {"ok": True, "us": [8.0, 8.0], "bytes": 1}}
    md = report.render({"info": info, "cases": [{"family": "softmax", "name": "1x151936 bf16", "impls": impls}]})
    row = next(l for l in md.splitlines() if l.startswith("| 1x151936"))
    assert "torch-mps 2.15 µs" in md and "1.25 (torch-mps 2.15)" in row  # ÷ best peer counts torch's kernels


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
@needs_sources
def test_nvcc_compiles_torch_translation(peer_torch, tmp_path):
    modules = peer_torch.modules(SOURCES)
    built = _tool("cuda").build(modules, tmp_path, log=lambda *_: None, check_only=True)
    assert sorted(built) == ["torch_softmax"]
    hosts = set(modules[0].hosts())
    assert {f"softmax_{k}_{t}_u32" for k in ("row", "partial", "finalize") for t in ("float", "bfloat")} <= hosts
