"""The torch-mps peer of tools/cuda_check/peers.py (peer_torch.py) without a GPU: torch 2.15's softmax routing on
known shapes, its launches on the simulator against torch's own op, the table column, and with nvcc on PATH
that its translation compiles. torch's sources come from MPS_EXT_TORCH_MPS (or build/peer_sources/torch); its
attention kernels, headers of the macOS wheel, also from the torch 2.15 wheel that tools/check_macos.py fetches."""

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
# SoftMax.metal is in pytorch's tree only (the wheel has the headers).
needs_sources = pytest.mark.skipif(not (SOURCES / "aten/src/ATen/native/mps/kernels/SoftMax.metal").is_file(),
                                   reason="no torch sources")
WHEEL = Path(os.environ.get("MPS_EXT_CACHE_DIR") or Path.home() / ".cache" / "mps_ext") / "macos-v2" / \
    "torch-2.15.0" / "include"


def _tool(name: str):
    if str(TOOL) not in sys.path:
        sys.path.insert(0, str(TOOL))
    return importlib.import_module(name)


@pytest.fixture(scope="module")
def headers(tmp_path_factory):
    """torch 2.15's kernel headers in pytorch's layout: the sources given, else extracted from the wheel."""
    if (SOURCES / "c10" / "metal").is_dir():
        return SOURCES
    if not WHEEL.is_dir():
        pytest.skip("no torch 2.15 headers: run `python tools/check_macos.py --fetch-only` first")
    dest = tmp_path_factory.mktemp("torch_headers")
    _tool("peer_torch").extract(dest, wheel=WHEEL)
    return dest


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
def test_nvcc_compiles_torch_translation(peer_torch, headers, tmp_path):
    modules = peer_torch.modules(headers, tmp_path / "gen")
    built = _tool("cuda").build(modules, tmp_path, log=lambda *_: None, check_only=True)
    assert sorted(built) == sorted(m.name for m in modules) and {"torch_attention", "torch_gemv"} <= set(built)
    hosts = {h for m in modules for h in m.hosts()}
    assert {"sdpa_vector_bfloat_128_128_masknone", "sdpa_vector_2pass_1_bfloat_128_128_masknone",
            "sdpa_vector_2pass_2_bfloat_256", "prefill_attention_bfloat16_bq32_bk16_bd128_wm4_wn1_hm0_dc1_maskbfloat16",
            "gemv_nt_bfloat_4_8_none_xc", "gemv_nt_half_8_8_none_xc"} <= hosts
    if "torch_softmax" in built:
        assert {f"softmax_{k}_{t}_u32" for k in ("row", "partial", "finalize") for t in ("float", "bfloat")} <= hosts


def test_attention_routing_is_torch_2_15s(peer_torch):
    # _scaled_dot_product_attention_math_mps: vector kernels to 8 query rows at head dims 64-256 (two passes from
    # 1024 keys), the flash kernel's tiles by head dim past 8 rows, MPSGraph for the rest (and no sinks at all).
    route = peer_torch.attention_route
    assert route(32, 8, 128, 128, 1, 512, False) == ("vector",)
    assert route(32, 8, 128, 128, 4, 1024, False) == ("2pass",) == route(32, 32, 96, 96, 1, 32768, False)
    assert route(32, 8, 128, 128, 512, 512, False) == ("prefill", 32, 16, 4)
    assert route(16, 8, 256, 256, 4096, 4096, False) == ("prefill", 16, 8, 2)
    assert route(32, 32, 80, 80, 9, 9, False) == ("prefill", 32, 32, 4)
    assert route(32, 32, 80, 80, 1, 4096, False)[0] == "general"  # no vector kernel at 80
    assert route(16, 16, 192, 128, 1, 4096, False)[0] == "general"
    assert route(64, 8, 64, 64, 1, 4096, True)[0] == "general"


@pytest.mark.parametrize("b, heads, kv_heads, dim, q_len, keys, causal", [
    (1, 4, 2, 64, 1, 37, False),      # sdpa_vector, GQA
    (1, 2, 2, 64, 3, 5, True),        # sdpa_vector, causal (top-left)
    (2, 2, 1, 96, 3, 1100, False),    # sdpa_vector_2pass: 32 blocks of 8 keys in turn
    (1, 2, 1, 64, 40, 40, True),      # prefill_attention, causal, rows and keys past a tile
])
def test_attention_launches_match_torch_on_the_simulator(peer_torch, headers, tmp_path, b, heads, kv_heads, dim,
                                                         q_len, keys, causal):
    # The launches peer_torch plans run torch 2.15's own attention kernels in the simulator (translated as the
    # proxy translates them, instantiated for this shape) and give torch's
    # attention on every route.
    sim = pytest.importorskip("mps_ext.sim")
    dtype = torch.bfloat16
    q = torch.randn(b, heads, q_len, dim).to(dtype)
    k, v = (torch.randn(b, kv_heads, keys, dim).to(dtype) for _ in range(2))
    out = torch.full_like(q, float("nan"))
    source = peer_torch.attention_source(headers, [(heads, kv_heads, dim, dim, False, b, q_len, keys, causal)])
    lib = sim.compile_shader("#define __METAL__ 1\n" + source, name="torch_attention.metal",
                             include_dirs=[str(headers), str(headers / "aten" / "src")])
    for l in peer_torch.attention(q, k, v, out, causal, peer_torch.attention_scratch(q, keys)):
        buffers = [bytes(x.numpy()) if x.dtype == torch.uint8 else x for x in l.buffers]
        sim.dispatch(lib, l.kernel.split("/")[1], buffers, l.grid, l.threads, grid_in_threads=False)
    want = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal,
                                                            enable_gqa=True)
    assert ((out.double() - want).norm() / want.norm()).item() < 1e-2


def test_gemv_config_is_torchs_policy(peer_torch):
    # GemvPolicy::pick_nt: 8 SIMD groups from 8192 outputs for half types (float: 4 from 2048, else 16), loads
    # of 8 elements (float 4) halved while the row length is not a multiple.
    config = peer_torch.gemv_config
    assert config(torch.bfloat16, 4096, 4096) == (4, 8) and config(torch.float16, 128256, 4096) == (8, 8)
    assert config(torch.bfloat16, 14336, 4100) == (8, 4) and config(torch.bfloat16, 100, 4099) == (4, 1)
    assert config(torch.float32, 4096, 4096) == (4, 4) and config(torch.float32, 1000, 4098) == (16, 2)


@pytest.mark.parametrize("dtype, n, k", [(torch.bfloat16, 37, 72), (torch.float16, 8200, 20),
                                         (torch.bfloat16, 9, 1027)])
def test_gemv_launches_match_torch_on_the_simulator(peer_torch, headers, dtype, n, k):
    # torch 2.15's gemv_nt as peer_torch plans F.linear of one row (outputs past the last full threadgroup,
    # loads of 8 and 4 elements and one at a time, the tail of a row) gives torch's F.linear.
    sim = pytest.importorskip("mps_ext.sim")
    w = (torch.randn(n, k) * 0.1).to(dtype)
    x = torch.randn(1, k).to(dtype)
    y = torch.full((1, n), float("nan"), dtype=dtype)
    lib = sim.compile_shader("#define __METAL__ 1\n" + peer_torch.gemv_source(headers, [(dtype, n, k)]),
                             name="torch_gemv.metal", include_dirs=[str(headers), str(headers / "aten" / "src")])
    for l in peer_torch.gemv(w, x, y):
        buffers = [bytes(b.numpy()) if b.dtype == torch.uint8 else b for b in l.buffers]
        sim.dispatch(lib, l.kernel.split("/")[1], buffers, l.grid, l.threads, grid_in_threads=False)
    want = x.double() @ w.double().T
    assert ((y.double() - want).norm() / want.norm()).item() < 4e-3
