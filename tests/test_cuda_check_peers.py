"""tools/cuda_check/peers.py without a GPU: its case list, the plans it launches (ours from our host's
plan, the peers' from theirs), the references it checks against, and the tables it writes from the
times of two passes (a fake timing source here). With nvcc on PATH and the peers' sources at hand
(MPS_EXT_PEERS, or ../shared/peer_proxy/sources beside the checkout), the peers' translation compiles.
"""

import dataclasses
import importlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mps_ext.testing import assert_close_normwise

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools" / "cuda_check"
PEERS = Path(os.environ.get("MPS_EXT_PEERS", ROOT.parent / "shared" / "peer_proxy" / "sources"))
needs_peers = pytest.mark.skipif(not (PEERS / "ggml").is_dir(), reason="no peer sources (MPS_EXT_PEERS)")


def _tool(name: str):
    if str(TOOL) not in sys.path:
        sys.path.insert(0, str(TOOL))
    return importlib.import_module(name)


def _on_cpu(monkeypatch):
    """Buffers, and the GPU copies a replay of our recorded plans makes, on the CPU."""
    for name in ("cuda", "replay"):
        monkeypatch.setattr(_tool(name), "DEV", "cpu")


@pytest.fixture
def tool(monkeypatch):
    """The peers tool's modules with their buffers on the CPU."""
    _on_cpu(monkeypatch)
    return _tool("peer_cases"), _tool("peers"), _tool("peer_report")


def _small(case):
    """The case at a size the CPU builds in milliseconds, keeping what decides each host's plan: the number
    of rows of x, tokens and top-k, K a multiple of 128 (ggml's wide kernels) and at least 384 (its four
    SIMD groups), softmax columns on both sides of 4096."""
    dims = {"gemv": lambda n, k, m: (96, 512, m), "fp8": lambda n, k, m: (96, 512, m),
            "moe": lambda e, topk, op, n, k, t: (8, 2, op, 48, 384, min(t, 4)),
            "moe_fp8": lambda e, topk, op, n, k, t: (8, 2, op, 48, 384, min(t, 4)),
            "moe_kn": lambda e, topk, op, n, k, t: (8, 2, op, 40, 64, t),
            "softmax": lambda rows, cols: (min(rows, 3), cols),
            "pad": lambda shape, pad, mode: (_shrunk(shape), tuple(min(p, 3) for p in pad), mode),
            "upsample": lambda shape, size, mode, cl: (_shrunk(shape), _shrunk(size, shape), mode, cl),
            "dropout": lambda shape, p, call: (_shrunk(shape), p, call),
            "attention": _small_attention}[case.family](*case.dims)
    return dataclasses.replace(case, dims=dims)


def _small_attention(heads, kv_heads, dim, v_dim, sinks, batch, rows, keys, causal):
    """Attention keeping what the hosts route by: the GQA factor, head dims, sinks, batch, query rows, and the
    decode's key length (MLX's passes and blocks, ggml's SIMD groups); one or two KV heads, prefill 64 long."""
    kv = min(kv_heads, 2)
    if rows > 8:
        rows = keys = 64
    return heads // kv_heads * kv, kv, dim, v_dim, sinks, batch, rows, keys, causal


def _shrunk(dims, like=None):
    """Each dimension at most 12 (batch and channels at most 2); with `like`, an output size scaled as the
    input's dimensions `like` were (the interpolation's ratio kept)."""
    if like is not None:
        small = _shrunk(like)[-len(dims):]
        return tuple(max(1, round(d * s / l)) for d, s, l in zip(dims, small, like[-len(dims):]))
    return tuple(min(d, 2) for d in dims[:2]) + tuple(min(d, 12) for d in dims[2:])


def test_case_list_is_the_reports(tool):
    peer_cases, _, peer_report = tool
    cases = peer_cases.cases()
    counts = {f: sum(c.family == f for c in cases) for f in peer_report.TABLES}
    # 4 Llama-3-8B shapes x m=1,4 (x bf16, fp16 for GEMV); 2 expert shapes x 5 token counts; 6 gpt-oss cases;
    # 5 softmax shapes x fp32, bf16; 6 pad and 6 interpolation cases; 3 dropout shapes, forward and backward;
    # attention: 5 shapes (Llama-3-8B, Qwen3-8B and Mistral-7B share one) x 5 decode cases, 2 prefill models x 2.
    assert counts == {"gemv": 16, "fp8": 8, "moe": 10, "moe_fp8": 10, "moe_kn": 6, "softmax": 10, "pad": 6,
                      "upsample": 6, "dropout": 6, "attention": 29}
    assert len({(c.family, c.name) for c in cases}) == len(cases)


@pytest.fixture(scope="module")
def built():
    """Every case, small, with our_plan recorded: {(family, case name): (implementations, our plans)}."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        _on_cpu(monkeypatch)
        return _build_all(_tool("peer_cases"), monkeypatch)


def _build_all(peer_cases, monkeypatch):
    ggml = _tool("peer_plans").Ggml(PEERS)
    planned = []
    real = peer_cases.our_plan

    def recorded(*args, **kwargs):
        planned.append(real(*args, **kwargs))
        return planned[-1]

    monkeypatch.setattr(peer_cases, "our_plan", recorded)
    built = {}
    for case in peer_cases.cases():
        if case.family in ("gemv", "moe", "softmax", "attention") and not (PEERS / "ggml").is_dir():
            continue  # ggml's argument structs come from its sources
        planned.clear()
        built[case.family, case.name] = (peer_cases.implementations(_small(case), ggml, rotate=1 << 16),
                                          list(planned))
    return built


def test_ours_come_from_our_plan(built):
    # Ours (and our bf16 beside FP8) launch exactly what our_plan returns, for every input set: the one place
    # where the tool takes our host's plans.
    assert {f for f, _ in built} >= {"fp8", "moe_fp8", "moe_kn"}
    for (family, name), (impls, planned) in built.items():
        ours = [i for i in impls if i.name in ("ours", "bf16")]
        assert [launches for i in ours for launches in i.runs] == [launches for launches, _ in planned], name
        kernels = {l.kernel.split("_")[0] for i in ours for l in i.runs[0]}
        assert kernels <= {"gemv", "fp8", "grouped", "softmax", "pad", "upsample", "dropout", "attention"}, \
            (name, kernels)


def test_our_plan_is_the_hosts_bound_to_the_cases_own_tensors(tool):
    # Recorded on CPU stand-ins of the same sizes and strides, replayed on the case's tensors themselves,
    # at their offsets (views one row into their storage here), not on copies.
    peer_cases = tool[0]
    import mps_ext

    X, W = torch.randn(3, 512).bfloat16()[1:], torch.randn(98, 512).bfloat16()[1:]
    launches, out = peer_cases.our_plan(mps_ext.linear, X, W)
    with mps_ext.trace() as t:
        want = mps_ext.linear(X, W)
    pad = lambda v: tuple(v) + (1,) * (3 - len(v))
    assert [(l.kernel, pad(l.grid), pad(l.threads)) for l in launches] == \
        [(k.name, k.grid, k.threadgroup) for k in t.kernels]
    addresses = {a for l in launches for a in l.addresses}
    assert {X.data_ptr(), W.data_ptr(), out.data_ptr()} <= addresses
    assert out.shape == want.shape and out.stride() == want.stride() and out.dtype == want.dtype


@needs_peers
def test_peer_kernels_are_built(built, tmp_path):
    hosts = {m.name: set(m.hosts()) for m in _tool("peer_sources").modules(PEERS, tmp_path)}
    used = set()
    for (family, name), (impls, _) in built.items():
        for impl in impls:
            if impl.name in ("ggml", "mlx") and not impl.not_applicable:
                for l in impl.runs[0]:
                    module, host = l.kernel.split("/")
                    assert host in hosts[module], (name, l.kernel)
                    used.add(module)
    assert used == set(hosts)


def test_references_are_what_torch_computes(built):
    # torch's own op on each case's inputs (set 0) matches the reference every implementation is checked
    # against, in the reference's row order (MoE rows sorted by expert are put back).
    for (family, name), (impls, _) in built.items():
        for impl in impls:
            if impl.name == "torch" and not impl.not_applicable:
                impl.runs[0]()
                out = impl.output()
                assert out.shape == impl.ref.shape, name
                assert_close_normwise(out, impl.ref)


def _fake_measure(times: dict, wrong: set, per_pass: int, pass2: dict):
    """measure(impl) for run_passes making `per_pass` measurements a pass: µs by implementation, times
    pass2[name] in pass 2; an implementation in `wrong` fails its check."""
    calls = [0]

    def measure(impl):
        calls[0] += 1
        if impl.name in wrong:
            return {"ok": False, "rel_err": 0.5}
        return {"ok": True, "rel_err": 1e-4, "us": times[impl.name] * (pass2[impl.name] if calls[0] > per_pass else 1.0)}
    return measure


def _row(markdown: str, heading: str, case: str) -> list[str]:
    table = markdown.split(f"### {heading}")[1].split("###")[0]
    line = next(l for l in table.splitlines() if l.startswith(f"| {case} |"))
    return [c.strip() for c in line.strip("|").split("|")]


def test_tables_from_two_passes(tool):
    peer_cases, peers, peer_report = tool
    cases = [c for c in peer_cases.cases() if c.name in ("q_proj m=1 bf16", "q_proj m=1", "1x151936 bf16")]
    Impl = peer_cases.Impl
    names = {"gemv": ["ours", "ggml", "mlx", "torch"], "fp8": ["ours", "bf16", "torch"],
             "softmax": ["ours", "mlx", "torch"]}
    nbytes = 20_000_000  # 2000 GB/s in 10 µs: half the copy bandwidth below

    def implementations(case):
        return [Impl(n, [lambda: None], None, None, torch.bfloat16, nbytes) for n in names[case.family]]

    times = {"ours": 10.0, "ggml": 12.0, "mlx": 11.0, "torch": 9.0, "bf16": 8.0}
    pass2 = {"ours": 1.01, "ggml": 1.02, "mlx": 0.97, "torch": 1.0, "bf16": 1.0}
    per_pass = sum(len(names[c.family]) for c in cases)
    rows = peers.run_passes(cases, implementations, _fake_measure(times, set(), per_pass, pass2), log=lambda *a: None)
    result = {"info": {"device": "H200", "sms": 132, "torch": "2.13", "cuda": "13.0", "copy_gbs": 4000.0,
                       "commit": "abc1234"}, "cases": rows}
    md = peer_report.render(result)
    assert _row(md, "Decode GEMV", "q_proj m=1 bf16") == [
        "q_proj m=1 bf16", "10.0 (50%)", "12.0 (42%)", "11.0 (45%)", "9.0 (56%)", "0.91 (MLX)", "10.1"]
    assert _row(md, "FP8 decode", "q_proj m=1")[4:] == ["1.25", "10.1"]  # ÷ our bf16 GEMV: no peer named
    assert _row(md, "Softmax", "1x151936 bf16")[2] == "n/a"  # ggml has no bf16 softmax
    # Ours 1% apart in every case; the peers' (ggml 2%, MLX 3% in two cases): median 3%, at most 3%.
    assert "differ between the passes by 1.0% at the median, 1.0% at most; ggml's and MLX's by 3.0% and 3.0%." in md
    assert "MoE" not in md  # families the run did not hold make no table

    # A peer whose output was wrong is shown so and never counts as the best one.
    rows = peers.run_passes(cases[:1], implementations, _fake_measure({**times, "ggml": 5.0}, {"mlx"}, 4, pass2),
                            log=lambda *a: None)
    row = _row(peer_report.render({**result, "cases": rows}), "Decode GEMV", "q_proj m=1 bf16")
    assert row[3] == "wrong (rel err 5.0e-01)" and row[5] == "2.00 (ggml)"


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
@needs_peers
def test_nvcc_compiles_peer_translation(tmp_path):
    modules = _tool("peer_sources").modules(PEERS, tmp_path / "gen")
    built = _tool("cuda").build(modules, tmp_path, log=lambda *_: None, check_only=True)
    assert sorted(built) == sorted(m.name for m in modules)
    assert all(p.stat().st_size > 0 for p in built.values())


def test_attention_cases_are_the_benchmarks(tool):
    # One list for both: bench_attention.py (torch's MPS SDPA on a Mac) and the peers tool.
    peer_cases = tool[0]
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import _attention_cases
    import bench_attention

    assert (bench_attention.MODELS, bench_attention.DECODE, bench_attention.PREFILL) == \
        (_attention_cases.MODELS, _attention_cases.DECODE, _attention_cases.PREFILL)
    attention = [c for c in peer_cases.cases() if c.family == "attention"]
    assert attention == _attention_cases.cases()
    shapes = {c.dims[:5] for c in attention}
    assert {m[1:] for m in _attention_cases.MODELS} == shapes  # every model's shape, each once
    assert all(c.dtype == torch.bfloat16 for c in attention)


def test_attention_routing_is_each_hosts(tool):
    plans = _tool("peer_plans")
    # MLX on an Ultra-class GPU: one pass below 1024 keys, else two with blocks by keys and query SIMD groups
    # (GQA factor x query rows); steel_attention for prefill (BK 16 from head dim 128), its ops past d 192.
    route = plans.mlx_attention_route
    assert route(32, 8, 128, 128, 1, 512) == ("vector",)
    assert route(32, 8, 128, 128, 1, 4096) == ("2pass", 128) == route(32, 8, 128, 128, 4, 4096)
    assert route(32, 32, 96, 96, 1, 32768) == ("2pass", 256)  # 1 SIMD group per KV head
    assert route(64, 8, 64, 64, 1, 32768) == ("2pass", 512)  # 8
    assert route(16, 16, 192, 128, 1, 32768) == ("2pass", 256)
    assert route(32, 8, 128, 128, 512, 512) == ("steel", 16) and route(64, 8, 64, 64, 4096, 4096) == ("steel", 32)
    assert route(16, 8, 256, 256, 512, 512)[0] == "unfused"
    # ggml: vec below 20 queries, SIMD groups doubled with the keys; bf16 has no tuned rows (one query per
    # threadgroup, the baseline NE).
    assert [plans.ggml_fa_vec_nsg(n) for n in (512, 4096, 32768)] == [1, 2, 4]
    assert plans.ggml_fa_use_vec(128, 4) and not plans.ggml_fa_use_vec(128, 512)
    # Prefill: the simdgroup-matrix kernel, for the head dims fa_f16.metal instantiates.
    assert plans.ggml_attention_unsupported(128, 128, 512) is None is plans.ggml_attention_unsupported(64, 64, 4096)
    assert "160/160" in plans.ggml_attention_unsupported(160, 160, 512)
    assert {"vector", "2pass", "steel"} <= set(plans.MLX_TRANSLATED)


def test_attention_peers_not_applicable_are_reported(built):
    # Where a peer cannot express a case it is said so (never dropped): torch has no sinks, torch 2.15's Metal
    # kernels neither sinks nor MLA head dims. Every case, decode and prefill, runs ours,
    # ggml's and MLX's; torch-mps's cells need its sources (peers.py --torch-mps), else say that they are missing.
    peer_torch = _tool("peer_torch")
    for (family, name), (impls, _) in built.items():
        if family != "attention":
            continue
        na = {i.name: i.not_applicable for i in impls if i.not_applicable}
        assert {i.name for i in impls} == {"ours", "ggml", "mlx", "torch", "torch_mps"}, name
        assert ("torch" in na) == name.startswith("gpt-oss"), name
        assert set(na) - {"torch", "torch_mps"} == set(), (name, na)
        if name.startswith(("gpt-oss", "mla")):
            assert na["torch_mps"] != peer_torch.NO_SOURCES, name
        else:
            assert na.get("torch_mps") in (None, peer_torch.NO_SOURCES), name


@needs_peers
def test_attention_prefill_plans_are_the_hosts(built):
    # The prefill peers as their hosts launch them (the small cases: 64 queries over 64 keys, causal).
    # MLX (sdpa_full_self_attention_metal): steel_attention, BQ 32, BK 32 below head dim 128 else 16, WM 4 x WN 1
    # SIMD groups, a threadgroup per 32 queries of each head; AttnParams with the output's (B, L, H, V) strides.
    # ggml (ggml_metal_op_flash_attn_ext): the mask's block map (a threadgroup per 8 queries x 64 keys), then the
    # kernel (8 queries a threadgroup, 4 SIMD groups below head dim 512, Q*(DK + 2*PAD(DV, 64) + 4*64) halfs of
    # threadgroup memory).
    import struct

    seen = set()
    for (family, name), (impls, _) in built.items():
        if family != "attention" or "prefill" not in name:
            continue
        by = {i.name: i for i in impls}
        mlx, ggml = by["mlx"].runs[0], by["ggml"].runs[0]
        out = by["mlx"].output()
        heads, rows, dim = out.shape[1], out.shape[2], out.shape[3]
        bk = 32 if dim < 128 else 16
        assert len(mlx) == 1 and mlx[0].kernel.endswith(f"steel_attention_bfloat16_bq32_bk{bk}_bd{dim}_wm4_wn1_maskbfloat16")
        assert (mlx[0].grid, mlx[0].threads) == ((rows // 32, heads, 1), (32, 4, 1)), name
        params = mlx[0].buffers[4].cpu().numpy().tobytes()
        b, h, d, ql, kl, gqa, scale, nq, nk, nqa, nka, qrem, krem, qoff = struct.unpack("<6if7i", params[:56])
        assert (b, h, d, ql, kl, nq, nk, nqa, nka, qrem, krem, qoff) == (1, heads, dim, rows, rows, rows // 32,
                                                                             rows // bk, rows // 32, rows // bk, 0, 0, 0)
        assert struct.unpack("<3q", params[56 + 72:56 + 96]) == out.stride()[:3] == (rows * heads * dim, dim, heads * dim)
        blk, fa = ggml
        assert blk.kernel.endswith("/kernel_flash_attn_ext_blk") and fa.kernel.endswith(f"_bf16_dk{dim}_dv{dim}")
        assert (blk.grid, blk.threads) == ((rows // 64, rows // 8, 1), (32, 1, 1))
        assert (fa.grid, fa.threads, fa.smem) == ((rows // 8, heads, 1), (32, 4, 1), 8 * (dim + 2 * -(-dim // 64) * 64 + 256) * 2)
        seen.add(dim)
    assert seen == {64, 128}


def test_prefill_source_forms():
    # The forms of ggml's prefill kernel and MLX's steel headers that nvcc does not take, as their equivalents.
    forms = _tool("peer_sources").PeerTranslator.source_forms
    assert forms("float M[NQ] = { [0 ... NQ-1] = -FLT_MAX/2 };") == \
        "float M[NQ]; for (int mtlcuda_i = 0; mtlcuda_i < NQ; ++mtlcuda_i) M[mtlcuda_i] = -FLT_MAX/2;"
    assert forms("float S[NQ] = { [0 ... NQ-1] = 0.0f };") == "float S[NQ] = {};"
    assert forms("#pragma unroll (MIN(DK8/2, 4*NSG))") == "#pragma unroll (((DK8/2) < ( 4*NSG) ? (DK8/2) : ( 4*NSG)))"
    spaces = ("template <typename T> struct pointer_element<thread T*> { using type = T; };\n"
              "template <typename T> struct pointer_element<device T*> { using type = T; };")
    assert forms(spaces).strip() == spaces.splitlines()[0]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
@pytest.mark.parametrize("apple", [True, False])
def test_simdgroup_matrix_lanes(tmp_path, apple):
    # include/mtlcuda.h's placement of 8x8 matrix elements: Apple's (MLX's BaseMMAFrag::get_coord) where the peers
    # ask for it, each lane's (row, column pair) once, and the source lanes of a product (the reader's lane bits
    # masked, or'ed with a constant of k) the lanes that hold those elements.
    src = tmp_path / "lanes.cu"
    src.write_text(("#define MTLCUDA_APPLE_MATRIX_LANES 1\n" if apple else "") + '''#include "mtlcuda.h"
using namespace metal::matrix_lanes;
constexpr bool placed() {
  unsigned seen = 0;
  for (uint l = 0; l < 32; ++l) {
    const uint r = row(l), c = col(l), qid = l / 4;
    if (APPLE && (r != (qid & 4) + (l / 2) % 4 || c != (qid & 2) * 2 + (l % 2) * 2)) return false;
    if (c % 2 || lane_of(r, c / 2) != l) return false;
    seen |= 1u << lane_of(r, c / 2);
    for (uint k = 0; k < 8; ++k)
      if (((l & kRowBits) | lane_of(0, k / 2)) != lane_of(r, k / 2) ||
          (lane_of(k, 0) | (l & kColBits)) != lane_of(k, c / 2)) return false;
  }
  return seen == 0xffffffffu;
}
static_assert(placed(), "simdgroup matrix lanes");
'''.replace("APPLE", "true" if apple else "false"))
    proc = subprocess.run(["nvcc", "-ptx", "-arch=sm_90", "-std=c++17", "-I", str(TOOL / "include"), "-o",
                           str(tmp_path / "lanes.ptx"), str(src)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_attention_table_names_what_is_not_applicable(tool):
    peer_cases, peers, peer_report = tool
    case = next(c for c in peer_cases.cases() if c.name == "gpt-oss-20b decode b1 q1 kv512")
    Impl = peer_cases.Impl

    def implementations(case):
        return [Impl(n, [lambda: None], None, None, torch.bfloat16, 1_000_000) for n in ("ours", "ggml", "mlx")] + \
            [peer_cases.not_applicable("torch", "no sinks")]

    times, pass2 = {"ours": 4.0, "ggml": 8.0, "mlx": 5.0}, {"ours": 1.0, "ggml": 1.0, "mlx": 1.0}
    rows = peers.run_passes([case], implementations, _fake_measure(times, set(), 3, pass2), log=lambda *a: None)
    md = peer_report.render({"info": {"device": "H100", "sms": 132, "torch": "2.11", "cuda": "13.0",
                                      "copy_gbs": 3000.0}, "cases": rows})
    row = _row(md, "Attention", case.name)
    assert row[4] == "n/a" and row[5] == "0.80 (MLX)"
    assert f"- torch CUDA: no sinks ({case.name})" in md


@needs_peers
def test_a_plan_a_peer_refuses_drops_its_cell_only(tool):
    # Two rows with K % 256 == 0 take a ggml kernel its module does not build (nxpsg 16): ggml's cell says so,
    # and ours, MLX's and torch's are still built and checked.
    peer_cases, _, _ = tool
    case = _tool("_decode_cases").Case("gemv", "two rows", (96, 512, 2), torch.bfloat16)
    impls = {i.name: i for i in peer_cases.gemv(case, _tool("peer_plans").Ggml(PEERS), rotate=0)}
    assert "its plan refuses the case" in impls["ggml"].not_applicable and "K % 256" in impls["ggml"].not_applicable
    assert not impls["ours"].not_applicable and not impls["torch"].not_applicable
    assert impls["mlx"].not_applicable  # MLX's plans: one and four rows


def test_reports_name_the_card_and_its_clocks(tool):
    # Every report says where the card's clocks were when the run started (and where they could be).
    _, _, peer_report = tool
    info = {"device": "NVIDIA H100 80GB HBM3", "sms": 132, "torch": "2.11", "cuda": "13.0", "copy_gbs": 3000.0,
            "clocks": {"clocks.sm": 1980, "clocks.max.sm": 1980, "clocks.mem": 2619, "clocks.max.mem": 2619}}
    md = peer_report.render({"info": info, "cases": []})
    assert "NVIDIA H100 80GB HBM3 (132 SMs; SM clock 1980 of 1980 MHz, memory 2619 of 2619 MHz" in md
    assert "clocks not read" in peer_report.render({"info": {**info, "clocks": None}, "cases": []})
    report = _tool("report")
    assert "SM clock 1980 of 1980 MHz" in report.render({"info": info, "small": [], "large": [], "kernels": {}})
