"""grouped_mm (Mixture-of-Experts): mps_ext's kernels against torch's CPU
_grouped_mm in every mode, the aten::_grouped_mm override, autograd through
torch's formulas, a small MoE layer, and checked mode."""

import re

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import mps_ext
from conftest import backend, on, ran
from tolerances import assert_close_dot, assert_close_normwise

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
TYPE = {torch.float32: "float", torch.float16: "half", torch.bfloat16: "bfloat"}
KERNEL = re.compile(r"grouped_mm_(decode_(kn_)?m(1|2|4|8)|tiled_m(16|32|64))_(?P<type>float|half|bfloat)")


def data(*shape, dtype=torch.float32, seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def offsets(sizes):
    return torch.tensor(sizes, dtype=torch.int32).cumsum(0, dtype=torch.int32)


def experts(g, k, n, dtype, seed=1):
    """b as transformers passes it: the (G, N, K) expert weights transposed to a (G, K, N) view."""
    return data(g, n, k, dtype=dtype, seed=seed).transpose(-2, -1)


def reference(a, b, offs):
    """torch._grouped_mm's result in float64 (a per-group loop as torch's CPU kernel runs it) and
    the mask of the positions it writes."""
    a64, b64 = a.double(), b.double()
    if a.dim() == 3 and b.dim() == 3:
        out = torch.bmm(a64, b64)
        return out, torch.ones_like(out, dtype=torch.bool)
    ends = [0] + offs.tolist()
    if a.dim() == 2 and b.dim() == 2:
        out = torch.stack([a64[:, s:e] @ b64[s:e] for s, e in zip(ends, ends[1:])])
        return out, torch.ones_like(out, dtype=torch.bool)
    rows = a.dim() == 2
    out = torch.zeros(a.shape[0] if rows else a.shape[1], b.shape[-1], dtype=torch.float64)
    mask = torch.zeros_like(out, dtype=torch.bool)
    for g, (s, e) in enumerate(zip(ends, ends[1:])):
        if rows:
            out[s:e], mask[s:e] = a64[s:e] @ b64[g], True
        else:
            out[:, s:e], mask[:, s:e] = a64[g] @ b64[:, s:e], True
    return out, mask


def check(a, b, offs=None, device="cpu", kernel=None, torch_too=False):
    """mps_ext.grouped_mm on `device` against the float64 reference (and torch._grouped_mm when asked);
    one grouped_mm kernel ran on the device's backend."""
    with mps_ext.trace() as t:
        got = mps_ext.grouped_mm(a.to(device), b.to(device), None if offs is None else offs.to(device)).cpu()
    want, mask = reference(a, b, offs)
    magnitude, _ = reference(a.abs(), b.abs(), offs)
    assert got.shape == want.shape and got.dtype == a.dtype
    k = a.shape[-1]  # at least every dot product's length
    assert_close_dot(got[mask], want[mask], magnitude[mask], k)
    if torch_too:
        theirs = torch._grouped_mm(a, b, offs=offs)
        assert got.stride() == theirs.stride()
        assert_close_dot(got[mask], theirs[mask].double(), magnitude[mask], k)
    if got.numel():
        assert len(t.kernels) == 1 and t.kernels[0].backend == backend(device), t.kernels
        m = KERNEL.fullmatch(t.names[0])
        assert m and m.group("type") == TYPE[a.dtype], t.names
        if kernel is not None:
            assert t.names[0].startswith(f"grouped_mm_{kernel}"), t.names
    return got, t


# Decode takes every row count per group (1, 2, 3-4, 5-8, and more than 8 in runs of up to 8) while the
# average stays at most 8, with the pipeline for the average active group (m1 for "empty groups", m2 for
# "twos", m4 for "threes", m8 for "skewed"); "uneven" averages more and takes tiles.
SIZES = {"empty groups": [0, 3, 0, 1, 0], "ones": [1, 1, 1, 1], "twos": [2, 0, 2], "threes": [3, 3, 3],
         "skewed": [0, 19, 0, 1, 6], "uneven": [5, 0, 17, 2, 40], "one group": [9], "all empty": [0, 0, 0]}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sizes", list(SIZES.values()), ids=list(SIZES))
def test_rows_split(device, dtype, sizes):
    # 2D x 3D, the MoE forward: rows of a per expert; a spare row past offs[-1] is left alone.
    offs = offsets(sizes)
    a, b = data(int(offs[-1]) + 1, 64, dtype=dtype), experts(len(sizes), 64, 40, dtype)
    check(a, b, offs, device, torch_too=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["transposed", "contiguous"])
def test_rows_split_tiled(device, dtype, layout):
    # Many rows per group: tiles; both layouts of b, tiles of 16, 32 and 64 rows.
    for rows, tm in [(12, 16), (30, 32), (70, 64)]:
        sizes = [rows - 3, 0, rows + 5, rows]
        offs = offsets(sizes)
        b = experts(4, 40, 72, dtype) if layout == "transposed" else data(4, 40, 72, dtype=dtype, seed=1)
        check(data(int(offs[-1]), 40, dtype=dtype), b, offs, device, kernel=f"tiled_m{tm}", torch_too=True)


@pytest.mark.parametrize("dtype", DTYPES)
def test_cols_split(device, dtype):
    # 3D x 2D: columns of b per group; columns past offs[-1] are left alone.
    offs = offsets([8, 0, 24, 40])
    check(data(4, 5, 48, dtype=dtype), data(48, 80, dtype=dtype, seed=1), offs, device, kernel="tiled_m16",
          torch_too=True)


@pytest.mark.parametrize("dtype", DTYPES)
def test_k_split(device, dtype):
    # 2D x 2D: K per group (the weight gradient), output (G, M, N); an empty K range gives zeros.
    offs = offsets([16, 0, 40, 8])
    got, _ = check(data(24, 72, dtype=dtype), data(72, 40, dtype=dtype, seed=1), offs, device, kernel="tiled_m32",
                   torch_too=True)
    assert not got[1].any()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,kernel", [(3, "decode"), (40, "tiled_m64")])
def test_batched(device, dtype, m, kernel):
    # 3D x 3D: a batched product, no offs; the transposed layout decodes when rows are few.
    check(data(3, m, 56, dtype=dtype), experts(3, 56, 24, dtype), None, device, kernel=kernel, torch_too=True)


def routing(tokens, experts_count, top_k, seed=0):
    """offs of a top-k routing of `tokens` tokens (random router logits), as a MoE layer sorts them."""
    logits = torch.randn(tokens, experts_count, generator=torch.Generator().manual_seed(seed))
    chosen = logits.topk(top_k, dim=-1).indices.flatten()
    counts = torch.bincount(chosen, minlength=experts_count)
    return counts.cumsum(0).to(torch.int32)


@pytest.mark.parametrize("groups", [1, 8, 64, 128])
def test_group_counts(device, groups):
    tokens = 6
    offs = routing(tokens, groups, min(groups, 4))
    a = data(int(offs[-1]), 32, dtype=torch.bfloat16)
    check(a, experts(groups, 32, 24, torch.bfloat16), offs, device, kernel="decode_m", torch_too=True)
    check(a, data(groups, 32, 24, dtype=torch.bfloat16, seed=1), offs, device, kernel="decode_kn", torch_too=True)


# (model, projection, K, N, experts, top-k): expert shapes of real MoE models, sized for the simulator where noted.
MOE_SHAPES = [
    ("Qwen3-30B-A3B", "gate_up (first 96 of 1536 rows)", 2048, 96, 128, 8),
    ("Qwen3-30B-A3B", "down (first 128 of 2048 rows)", 768, 128, 128, 8),
    ("gpt-oss-20b", "gate_up (first 128 of 5760 rows)", 2880, 128, 32, 4),
    ("Mixtral 8x7B", "w1 (first 128 of 14336 rows)", 4096, 128, 8, 2),
]


@pytest.mark.parametrize("model,proj,k,n,e,top_k", MOE_SHAPES, ids=[f"{m} {p}" for m, p, *_ in MOE_SHAPES])
@pytest.mark.parametrize("tokens", [1, 4])
def test_moe_decode_shapes(device, model, proj, k, n, e, top_k, tokens):
    offs = routing(tokens, e, top_k, seed=tokens)
    a = data(tokens * top_k, k, dtype=torch.bfloat16)
    check(a, experts(e, k, n, torch.bfloat16), offs, device, kernel="decode")


@pytest.mark.parametrize("tokens,kernel", [(1, "grouped_mm_decode_m2_bfloat"), (4, "grouped_mm_decode_m2_bfloat"),
                                           (16, "grouped_mm_decode_m2_bfloat"), (64, "grouped_mm_decode_m4_bfloat")])
def test_decode_grid_covers_routed_rows_only(tokens, kernel, device):
    # 128 experts, top-8: one threadgroup row per routed row of a (not per expert), the pipeline for the
    # rows an active expert has on average but at least two, the same grid whatever the routing: runs of
    # one or two rows, an expert routed twice reading its weights once for both.
    offs = routing(tokens, 128, 8, seed=tokens)
    if tokens == 16:  # this routing has both: single rows and experts with two
        counts = torch.diff(offs, prepend=offs.new_zeros(1))
        assert (counts == 1).any() and (counts == 2).any(), counts
    a = data(tokens * 8, 256, dtype=torch.bfloat16)
    _, t = check(a, experts(128, 256, 24, torch.bfloat16), offs, device, kernel="decode", torch_too=True)
    assert t.names == [kernel] and t.kernels[0].grid[1] == tokens * 8, t.kernels


@pytest.mark.parametrize("cores,slices", [(8, 2), (80, 4)])
def test_decode_fills_the_gpu(cores, slices):
    # One token, top-8 of 128 experts, 96 columns: the host counts 8 routed rows as 4 runs of two, x 48 SIMD
    # groups (two columns each) = 192 SIMD groups. An 8-core GPU (256 resident) gets pairs of SIMD groups
    # per column splitting K (k = 4096: 4 of 8 steps of 512 each); an 80-core one (2560) runs of four, as many
    # as a threadgroup has (2 steps each).
    offs = routing(1, 128, 8, seed=2)
    with mps_ext.sim.gpu_cores(cores):
        _, t = check(data(8, 4096, dtype=torch.bfloat16), experts(128, 4096, 96, torch.bfloat16), offs,
                     kernel="decode_m2", torch_too=True)
    assert t.kernels[0].grid[:2] == (12 * slices, 8) and t.kernels[0].threadgroup[0] == 128, t.kernels


@pytest.mark.parametrize("cores,chunks", [(8, 4), (80, 2)])
def test_decode_kn_fills_the_gpu(cores, chunks):
    # One token, top-4 of 32 experts stored (E, K, N), 256 columns: 8 threadgroups of 64 bytes of columns per
    # routed row x 4 rows x 4 SIMD groups = 128 SIMD groups. An 8-core GPU (256 resident) keeps 4 chunks of 16
    # bytes per threadgroup; an 80-core one (2560) takes 2, twice the threadgroups, each K-lane on half the rows.
    offs = routing(1, 32, 4, seed=3)
    with mps_ext.sim.gpu_cores(cores):
        _, t = check(data(4, 64, dtype=torch.bfloat16), data(32, 64, 256, dtype=torch.bfloat16, seed=1), offs,
                     kernel="decode_kn_m2", torch_too=True)
    assert t.kernels[0].grid[:2] == (256 // (8 * chunks), 4), t.kernels


def test_odd_layouts(device):
    # The kernels take what torch's stride rule rejects: odd K and N, a non-contiguous a, an
    # unaligned start, an expanded b (one expert for every group; its rows are N long), a transposed a.
    offs = offsets([2, 0, 5])
    check(data(7, 13), experts(3, 13, 11, torch.float32), offs, device, kernel="decode")
    check(data(7, 26)[:, ::2], experts(3, 13, 11, torch.float32), offs, device, kernel="tiled_m16")
    check(data(7 * 16 + 1, dtype=torch.half)[1:].view(7, 16), experts(3, 16, 8, torch.half), offs, device,
          kernel="decode")
    check(data(7, 16), data(16, 8, seed=1).expand(3, 16, 8), offs, device, kernel="decode_kn")
    check(data(7, 13), data(3, 13, 11), offs, device, kernel="decode_kn")  # rows of b 44 bytes apart
    check(data(16, 7).t(), experts(3, 16, 8, torch.float32), offs, device, kernel="tiled_m16")


def test_offsets_stay_on_device(device):
    # One dispatch of the same kernel and grid whatever offs holds: its values never reach the host
    # (no .item()/.cpu() of offs; the grid is the worst case).
    a, b = data(16, 32).to(device), experts(8, 32, 24, torch.float32).to(device)
    records = []
    for sizes in ([16, 0, 0, 0, 0, 0, 0, 0], [0] * 8, [2] * 8, [1, 0, 3, 0, 5, 0, 7, 0]):
        with mps_ext.trace() as t:
            mps_ext.grouped_mm(a, b, offsets(sizes).to(device))
        records.append(t.kernels)
    assert all(r == records[0] for r in records) and len(records[0]) == 1, records


ERRORS = [
    ("int a", lambda a, b, o: (a.int(), b, o), r"a \(mat_a\)"),
    ("1-D a", lambda a, b, o: (a[0], b, o), r"a \(mat_a\)"),
    ("4-D b", lambda a, b, o: (a, b[None], o), r"b \(mat_b\)"),
    ("K mismatch", lambda a, b, o: (a, b[:, :8], o), "contraction"),
    ("no offs", lambda a, b, o: (a, b, None), "offs"),
    ("int64 offs", lambda a, b, o: (a, b, o.long()), "offs"),
    ("2-D offs", lambda a, b, o: (a, b, o[None]), "offs"),
    ("offs length", lambda a, b, o: (a, b, o[:2]), "offs"),
    ("offs with 3D x 3D", lambda a, b, o: (b.transpose(1, 2)[:, :5], b, o), "offs"),
    ("mixed dtypes", lambda a, b, o: (a, b.double().float().half(), o), "dtype"),
]


@pytest.mark.parametrize("name,make,word", ERRORS, ids=[e[0] for e in ERRORS])
def test_errors(name, make, word):
    a, b, offs = data(10, 16, dtype=torch.bfloat16), experts(3, 16, 8, torch.bfloat16), offsets([3, 0, 4])
    args = make(a, b, offs)
    with pytest.raises(RuntimeError):
        torch._grouped_mm(args[0], args[1], offs=args[2])
    with pytest.raises(RuntimeError, match=word):
        mps_ext.grouped_mm(*args)


def test_out_dtype():
    a, b, offs = data(10, 16, dtype=torch.bfloat16), experts(3, 16, 8, torch.bfloat16), offsets([3, 0, 4])
    assert mps_ext.grouped_mm(a, b, offs, out_dtype=torch.bfloat16).dtype == torch.bfloat16
    with pytest.raises(RuntimeError, match="out_dtype"):
        mps_ext.grouped_mm(a, b, offs, out_dtype=torch.float32)


@pytest.mark.fallback("invalid arguments")
def test_override(device):
    a, b, offs = data(10, 16, dtype=torch.bfloat16), experts(3, 16, 8, torch.bfloat16), offsets([3, 0, 4])
    want = torch._grouped_mm(a, b, offs=offs)
    mps_ext.overrides.reset_stats()
    with mps_ext.overrides.enabled(device), mps_ext.trace() as t:
        got = on(device, torch._grouped_mm, a, b, offs=offs)
        with pytest.raises(RuntimeError, match="Offsets have to be int32"):  # torch's own error
            on(device, torch._grouped_mm, a, b, offs=offs.long())
        with pytest.raises(RuntimeError, match="strides should be multiple of 16 bytes"):  # torch's rule stays
            on(device, torch._grouped_mm, data(10, 7, dtype=torch.bfloat16), experts(3, 7, 8, torch.bfloat16),
               offs=offs)
    ran(t, device, "grouped_mm_decode_m4_bfloat")
    magnitude, mask = reference(a.abs(), b.abs(), offs)  # torch leaves the rows past offs[-1] unwritten
    assert_close_dot(got[mask], want[mask], magnitude[mask], 16)
    stats = mps_ext.overrides.stats()["aten::_grouped_mm"]
    assert stats["hits"] == 1 and stats["fallbacks"] == 2 and stats["reasons"] == {"invalid arguments": 2}


def moe_block(dtype):
    """transformers' own Qwen3-MoE block (router F.linear and softmax, top-k, the experts through
    torch._grouped_mm over their transposed weights), a tiny config with random weights."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    config = transformers.Qwen3MoeConfig(hidden_size=32, moe_intermediate_size=16, num_experts=8,
                                         num_experts_per_tok=2, norm_topk_prob=True)
    config._experts_implementation = "grouped_mm"  # what from_pretrained picks where torch has _grouped_mm
    block = Qwen3MoeSparseMoeBlock(config)
    with torch.no_grad():
        for seed, p in enumerate(block.parameters(), start=3):
            p.copy_(data(*p.shape, seed=seed) * 0.3)
    return block.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens", [2, 24])
def test_moe_block(dtype, tokens, device, request):
    if tokens > 8:  # the router's F.linear, past the GEMV's rows
        request.applymarker(pytest.mark.fallback("rows > 8"))
    block = moe_block(dtype)
    x = data(1, tokens, 32, dtype=dtype, seed=6).requires_grad_()
    want = block(x)
    want.sum().backward()
    want_grads = [x.grad.clone()] + [p.grad.clone() for p in block.parameters()]
    x.grad = None
    block.zero_grad(set_to_none=True)
    block.to(device)
    mps_ext.overrides.reset_stats()
    with mps_ext.overrides.enabled(device), mps_ext.trace() as t:
        got = on(device, block, x)
        got.sum().backward()
    got_grads = [x.grad] + [p.grad.cpu() for p in block.parameters()]
    # Forward: 2 grouped products; backward: the input and weight gradients of each (2D x 2D for weights).
    stats = mps_ext.overrides.stats()
    assert stats["aten::_grouped_mm"]["hits"] == 2 and stats["aten::_grouped_mm (backward)"]["hits"] == 4
    assert sum(n.startswith("grouped_mm_") for n in t.names) == 6, t.names
    assert all(k.backend == backend(device) for k in t.kernels), t.kernels
    assert any(n.startswith("softmax_") for n in t.names), t.names  # the router's
    for g, w in zip([got] + got_grads, [want] + want_grads):
        assert_close_normwise(g, w)


class GroupedMmOperands(TorchDispatchMode):
    """The b operands of every aten::_grouped_mm a piece of model code sends."""

    def __init__(self):
        super().__init__()
        self.b = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._grouped_mm.default:
            self.b.append(args[1])
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens", [1, 4])
def test_gpt_oss_experts(dtype, tokens, device):
    # transformers' own gpt-oss experts (tiny config, random weights, biases): their weights stay stored
    # (E, K, N), contiguous, so both products decode along N; hidden size 72 leaves a partial block of columns.
    transformers = pytest.importorskip("transformers")
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

    config = transformers.GptOssConfig(hidden_size=72, intermediate_size=40, num_local_experts=16,
                                       num_experts_per_tok=4)
    config._experts_implementation = "grouped_mm"  # what from_pretrained picks where torch has _grouped_mm
    module = GptOssExperts(config)
    with torch.no_grad():
        for seed, p in enumerate(module.parameters(), start=3):
            p.copy_(data(*p.shape, seed=seed) * 0.3)
    module = module.to(dtype)
    x = data(tokens, 72, dtype=dtype, seed=6)
    logits = data(tokens, 16, seed=7)
    top, chosen = logits.topk(4, dim=-1)
    weights = top.softmax(-1).to(dtype)
    with torch.no_grad():
        with GroupedMmOperands() as sent:
            want = module(x, chosen, weights)
        with mps_ext.overrides.enabled(device), mps_ext.trace() as t:
            got = on(device, module.to(device), x, chosen, weights)
    assert [(tuple(b.shape), b.is_contiguous()) for b in sent.b] == [((16, 72, 80), True), ((16, 40, 72), True)]
    ran(t, device, *[f"grouped_mm_decode_kn_m2_{TYPE[dtype]}"] * 2)
    assert_close_normwise(got, want)


def test_autograd(device):
    # mps_ext.grouped_mm's own derivative in every mode, against torch's on the CPU; offs covers every
    # position (torch leaves gradient rows past offs[-1] unwritten, ours are 0).
    cases = [(data(9, 16), experts(3, 16, 8, torch.float32), offsets([3, 0, 6])),
             (data(3, 4, 16), data(16, 12, seed=1), offsets([4, 0, 8])),
             (data(4, 12), data(12, 8, seed=1), offsets([4, 0, 8])),
             (data(3, 4, 16), experts(3, 16, 8, torch.float32), None)]
    for a, b, o in cases:
        def grads(fn):
            x, y = a.clone().requires_grad_(), b.detach().clone().requires_grad_()
            out = fn(x, y, o)
            out.backward(data(*out.shape, seed=7))  # a real gradient: torch's formulas reject expanded ones
            return x.grad, y.grad

        with mps_ext.trace() as t:
            got = grads(lambda x, y, o: on(device, mps_ext.grouped_mm, x, y, o))
        # The product and both gradients are grouped products, each on a kernel.
        assert len(t.kernels) == 3 and all(k.backend == backend(device) for k in t.kernels), t.kernels
        for g, w in zip(got, grads(lambda x, y, o: torch._grouped_mm(x, y, offs=o))):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_opcheck():
    offs = offsets([3, 0, 6])  # covers every row: positions past offs[-1] hold whatever memory held
    for args in [(data(9, 16), experts(3, 16, 8, torch.float32), offs), (data(4, 9), data(9, 8, seed=1), offs),
                 (data(3, 4, 16, dtype=torch.half), experts(3, 16, 8, torch.half), None)]:
        torch.library.opcheck(torch.ops.mps_ext.grouped_mm.default, (*args, None),
                              test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_static"))


@pytest.mark.parametrize("case", ["decode", "decode split K", "decode_kn", "decode_kn 4 chunks", "tiled_m16",
                                  "tiled_m64", "cols", "k"])
def test_checked(case, device):
    offs = offsets([2, 0, 3])
    args = {"decode": (data(13, 40), experts(3, 40, 9, torch.float32), offsets([2, 0, 11])),
            "decode split K": (data(6, 1180), experts(3, 1180, 9, torch.float32), offsets([1, 0, 4])),
            "decode_kn": (data(13, 70), data(3, 70, 37, seed=1), offsets([2, 0, 11])),
            "decode_kn 4 chunks": (data(13, 70), data(3, 70, 37, seed=1), offsets([2, 0, 11])),
            "tiled_m16": (data(30, 40), data(3, 40, 9, seed=1), offsets([10, 0, 30])),
            "tiled_m64": (data(2, 70, 40), experts(2, 40, 9, torch.float32), None),
            "cols": (data(3, 5, 40), data(40, 9, seed=1), offs),
            "k": (data(5, 6), data(6, 9, seed=1), offs)}[case]
    # One core's fill keeps decode_kn's 4 chunks of 16 bytes (16 float columns per threadgroup); 32 cores' takes 2.
    with mps_ext.sim.checked(), mps_ext.sim.gpu_cores(1 if case.endswith("4 chunks") else 32), mps_ext.trace() as t:
        got = on(device, mps_ext.grouped_mm, *args)
    assert len(t.kernels) == 1 and t.kernels[0].backend == backend(device), t.kernels
    want, mask = reference(*args)
    torch.testing.assert_close(got[mask].double(), want[mask], rtol=1e-5, atol=1e-5)
    if case.startswith("decode_kn") and device == "cpu":  # the simulator's core count; a Mac has its own
        assert t.kernels[0].grid[0] == (3 if case.endswith("4 chunks") else 5), t.kernels
