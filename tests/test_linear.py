"""linear (decode GEMV): mps_ext's kernels against torch's F.linear on the CPU,
the overrides of aten::linear / aten::mm / aten::addmm / aten::mv / aten::addmv,
autograd, and checked mode."""

import re

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import mps_ext
from conftest import backend
from mps_ext.testing import assert_raises_like
from tolerances import assert_close, assert_close_dot

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
TYPE = {torch.float32: "float", torch.float16: "half", torch.bfloat16: "bfloat"}
SIZES = [1, 3, 64, 127, 4096, 4099]


def bucket(rows: int) -> int:
    return 1 if rows <= 1 else 2 if rows <= 2 else 4 if rows <= 4 else 8


def reference(x, w, b=None):
    """F.linear in float32 on the CPU, rounded once to the input's dtype."""
    return F.linear(x.cpu().float(), w.cpu().float(), None if b is None else b.cpu().float()).to(x.dtype)


def check(x, w, b=None, kernel=None, device="cpu"):
    """Runs mps_ext.linear on `device`, compares with torch and checks that one gemv_ kernel ran: gemv_t_* for
    a weight stored k-major (columns contiguous, rows strided), else gemv_dense_* or gemv_splitk_*."""
    with mps_ext.trace() as t:
        got = mps_ext.linear(x.to(device), w.to(device), None if b is None else b.to(device)).cpu()
    want = reference(x, w, b)
    assert got.dtype == want.dtype and got.shape == want.shape
    magnitude = x.cpu().float().abs() @ w.cpu().float().abs().t() + (0 if b is None else b.cpu().float().abs())
    assert_close_dot(got, want, magnitude, x.shape[-1])
    assert len(t.kernels) == 1 and t.kernels[0].backend == backend(device)
    rows = max(1, x.numel() // max(1, x.shape[-1]))
    if w.stride(1) != 1 and min(w.shape) > 1:
        assert t.names == [f"gemv_t_m{bucket(rows)}_{TYPE[x.dtype]}"]
    else:
        w_rows = "4" if bucket(rows) == 8 else "[12]" if bucket(rows) == 1 else "2"  # rows of W per SIMD group
        assert re.fullmatch(rf"gemv_(dense|splitk)_m{bucket(rows)}_r{w_rows}_{TYPE[x.dtype]}", t.names[0]), t.names
    if kernel is not None:
        assert t.names[0].startswith(f"gemv_{kernel}_")
    return got


def with_cpu_overrides(call):
    with mps_ext.overrides.enabled("cpu"):
        return call()


def data(*shape, dtype=torch.float32, seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", range(1, 9))
@pytest.mark.parametrize("bias", [False, True])
def test_rows(device, dtype, rows, bias):
    x, w, b = data(rows, 300, dtype=dtype), data(67, 300, dtype=dtype, seed=1), data(67, dtype=dtype, seed=2)
    check(x, w, b if bias else None, kernel="dense", device=device)


# Every K and N tail in every dtype; the 4096-class products (16M weights)
# only in bfloat16 and with one row, for the simulator's time.
SIZE_CASES = [(n, k, dtype) for n in SIZES for k in SIZES for dtype in DTYPES
              if n * k <= 2**20 or dtype == torch.bfloat16]


@pytest.mark.parametrize("n,k,dtype", SIZE_CASES)
def test_sizes(device, n, k, dtype):
    rows = 1 if n * k > 2**20 else 3
    x, w, b = data(rows, k, dtype=dtype), data(n, k, dtype=dtype, seed=1), data(n, dtype=dtype, seed=2)
    check(x, w, b, device=device)


# (model, layer, out_features, in_features), sized for the simulator where noted.
MODEL_SHAPES = [
    ("Llama 3 8B", "q_proj", 4096, 4096),
    ("Llama 3 8B", "k_proj (GQA)", 1024, 4096),
    ("Qwen2.5 0.5B", "up_proj", 4864, 896),
    ("Qwen2.5 0.5B", "down_proj", 896, 4864),
    ("Qwen3-30B-A3B", "router", 128, 2048),
    ("DeepSeek-V3", "router (n = 256, k = 7168)", 256, 7168),
    ("Mixtral 8x7B", "router", 8, 4096),
    ("Gemma 2 2B", "gate_proj (first 4096 of 9216 rows)", 4096, 2304),
    ("Qwen2.5 0.5B", "lm_head (first 16384 of 151936 rows)", 16384, 896),
]


@pytest.mark.parametrize("model,layer,n,k", MODEL_SHAPES, ids=[f"{m} {l}" for m, l, _, _ in MODEL_SHAPES])
@pytest.mark.parametrize("rows", [1, 4])
def test_model_shapes(device, model, layer, n, k, rows):
    dtype = torch.bfloat16
    x, w = data(rows, 1, k, dtype=dtype), data(n, k, dtype=dtype, seed=1) / k**0.5  # [B, 1, K] hidden states
    # One row of x takes one row of W per SIMD group when the rows fill the simulator's 32 x 32 SIMD groups,
    # else two, as more rows of x do. Blocks of rows that leave at least half of the SIMD groups idle split a
    # K of at least 4 steps (a step: 32 lanes x 16 bytes, twice that for one row of x) over SIMD groups.
    per_simdgroup = 1 if rows == 1 and n >= 1024 else 2
    steps = -(-k // (32 * 8 * (2 if rows == 1 else 1)))
    kernel = "splitk" if 1024 // -(-n // per_simdgroup) >= 2 and steps >= 4 else "dense"
    got = check(x, w, kernel=f"{kernel}_m{bucket(rows)}_r{per_simdgroup}", device=device)
    assert got.shape == (rows, 1, n)


def test_split_k_for_routers(device):
    x, w = data(1, 7168), data(128, 7168, seed=1)
    with mps_ext.trace() as t:
        check(x, w, device=device)
    # 128 rows: two per SIMD group (too few to fill the GPU one each), 64 threadgroups splitting K.
    assert t.names == ["gemv_splitk_m1_r2_float"] and t.kernels[0].threadgroup[0] > 32 and t.kernels[0].grid[0] == 64


@pytest.mark.parametrize("cores,kernel,grid,threads", [(8, "gemv_dense_m1_r1_bfloat", 256, 128),
                                                      (80, "gemv_splitk_m1_r2_bfloat", 512, 64)])
def test_fill_from_gpu_cores(cores, kernel, grid, threads):
    # 1024 rows of W (a GQA k_proj): four times the SIMD groups an 8-core GPU keeps resident (8 x 32), one
    # row each, dense; 0.4 of an 80-core one (2560), where a SIMD group takes two rows and two SIMD groups
    # split K per pair (512 pairs, 1024 SIMD groups).
    x, w = data(1, 2048, dtype=torch.bfloat16), data(1024, 2048, dtype=torch.bfloat16, seed=1)
    with mps_ext.sim.gpu_cores(cores), mps_ext.trace() as t:
        check(x, w)
    assert t.names == [kernel] and t.kernels[0].grid[0] == grid and t.kernels[0].threadgroup[0] == threads


def test_gpu_core_counts():
    # The Metal backend's fallback when the GPU's registry entry has no core count: the smallest chip of
    # the architecture's tier (M1-M4 base, Pro, Max, Ultra).
    cores = mps_ext._C._apple_gpu_cores_of_architecture
    assert [cores(f"applegpu_g15{tier}") for tier in "gscd"] == [7, 14, 24, 48]
    assert cores("applegpu_g13s") == 14 and cores("something else") == 7
    with pytest.raises(ValueError, match="cores must be positive"):
        with mps_ext.sim.gpu_cores(0):
            pass
    with pytest.raises(TypeError, match="cores must be an int"):
        with mps_ext.sim.gpu_cores(8.0):
            pass


@pytest.mark.parametrize("dtype", DTYPES)
def test_input_shapes(device, dtype):
    w, b = data(50, 64, dtype=dtype, seed=1), data(50, dtype=dtype, seed=2)
    got = check(data(64, dtype=dtype), w, b, device=device)  # 1-D input
    assert got.shape == (50,)
    assert check(data(2, 1, 64, dtype=dtype), w, b, device=device).shape == (2, 1, 50)  # [B, 1, K]
    assert check(data(2, 2, 2, 64, dtype=dtype), w, device=device).shape == (2, 2, 2, 50)


@pytest.mark.parametrize("dtype", DTYPES)
def test_layouts(device, dtype):
    x, w, b = data(6, 130, dtype=dtype), data(40, 130, dtype=dtype, seed=1), data(40, dtype=dtype, seed=2)
    check(x[::2], w, b, device=device)  # rows of x strided
    check(data(130, 4, dtype=dtype).t(), w, b, device=device)  # x transposed: copied to rows
    # W rows with a stride (136) != K (130), 16-byte aligned: 16-byte loads, then a K tail.
    check(x, data(40, 136, dtype=dtype, seed=4)[:, :130], b, device=device)
    check(x[:, 1:], w[:, 1:], b, device=device)  # odd offsets and stride: element loads
    check(x[:3], w[::2], b[::2], device=device)  # every other row of W, bias strided
    wide = data(40 * 128 + 1, dtype=dtype, seed=3)
    check(data(129, dtype=dtype)[1:], wide[1:].view(40, 128), device=device)  # odd storage offsets, K = 128
    check(data(2 * 64 + 1, dtype=dtype)[1:].view(2, 64), data(40 * 64 + 3, dtype=dtype)[3:].view(40, 64), device=device)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", [520, 522, 600])
def test_k_tails_of_aligned_rows(device, dtype, k):
    # One row of x (a step: two 16-byte chunks per lane) with rows of W and x 16-byte aligned (stride 640): the
    # whole steps load without a bounds test; the chunks past them join the last one (K = 520, 600: some lanes'
    # chunks lie past K) or, one being partial (K = 522), take a checked step of their own. Checked mode
    # proves that no load strays past a row.
    x, w = data(1, 640, dtype=dtype)[:, :k], data(67, 640, dtype=dtype, seed=1)[:, :k]
    with mps_ext.sim.checked():
        check(x, w, kernel="dense_m1_r2", device=device)


def check_k_major(x, w_kn, b=None, device="cpu"):
    """check() with the weight stored k-major: w_kn is in_features x out_features, row-major with any row
    stride (x @ w_kn, as transformers' Conv1D computes it)."""
    return check(x, w_kn.t(), b, device=device)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8])
def test_k_major_weights(device, dtype, rows):
    # Columns past whole 16-byte loads (n = 2, 5, 257), rows of W not in whole steps of the slices (k = 2, 3,
    # 771), a bias or none. (With n or k = 1 both layouts are row-major: the dense kernels take them.)
    for n, k in ((257, 100), (5, 771), (2, 3), (1000, 2)):
        x, w, b = data(rows, k, dtype=dtype), data(k, n, dtype=dtype, seed=1), data(n, dtype=dtype, seed=2)
        check_k_major(x, w, b if n % 2 else None, device=device)


@pytest.mark.parametrize("dtype", DTYPES)
def test_k_major_layouts(device, dtype):
    x = data(3, 130, dtype=dtype)
    with mps_ext.sim.checked():
        check_k_major(x, data(130, 72, dtype=dtype, seed=1)[:, :70], device=device)  # rows padded, 16-byte aligned
        check_k_major(x, data(130, 71, dtype=dtype, seed=1)[:, 1:], device=device)  # odd offset and stride
        check_k_major(x[:, ::2], data(65, 300, dtype=dtype, seed=1), device=device)  # x strided: copied to rows
        with mps_ext.sim.gpu_cores(1):  # 32 SIMD groups: one slice per threadgroup
            check_k_major(x, data(130, 1000, dtype=dtype, seed=1), device=device)


@pytest.mark.fallback("weight neither row- nor column-major")
def test_weight_strided_both_ways_goes_to_torch():
    x, w = data(2, 64), data(60, 128)[::2, ::2]
    with mps_ext.trace() as t:
        got = mps_ext.linear(x, w)
    assert t.kernels == []
    assert_close(got, F.linear(x, w), scale=2)


@pytest.mark.fallback("rows > 8|empty")
@pytest.mark.parametrize("dtype", DTYPES)
def test_nine_rows_and_empty_go_to_torch(dtype):
    w = data(20, 33, dtype=dtype, seed=1)
    for x in (data(9, 33, dtype=dtype), data(3, 3, 33, dtype=dtype), data(0, 33, dtype=dtype)):
        with mps_ext.trace() as t:
            got = mps_ext.linear(x, w)
        assert t.kernels == [] and torch.equal(got, F.linear(x, w))
    with mps_ext.trace() as t:
        got = mps_ext.linear(data(2, 0, dtype=dtype), data(5, 0, dtype=dtype), data(5, dtype=dtype))
    assert t.kernels == [] and torch.equal(got, data(5, dtype=dtype).expand(2, 5))


def test_nan_and_inf(device):
    x, w, b = data(3, 100), data(10, 100, seed=1), data(10, seed=2)
    x[0, 5] = float("nan")
    x[1, 7] = float("inf")
    w[3, 9] = float("inf")
    got = check(x, w, b, device=device)
    assert got[0].isnan().all() and got[1].isinf().sum() + got[1].isnan().sum() >= 1
    assert torch.equal(got.isnan(), F.linear(x, w, b).isnan())


@pytest.mark.fallback("mixed dtypes|shape mismatch|weight not 2-D|dtype Double")
def test_errors_like_torch():
    x, w, b = data(2, 8), data(4, 8), data(4)
    cases = [
        ((x, w.half(), None), "weight"),
        ((x, w, b.half()), "bias"),
        ((data(2, 7), w, None), "in_features"),
        ((torch.tensor(1.0), w, None), "at least 1-D"),
    ]
    for args, name in cases:
        with pytest.raises(RuntimeError) as theirs:
            F.linear(*args)
        with pytest.raises(RuntimeError, match=name):
            mps_ext.linear(*args)
        # The override hands invalid calls to torch, which raises its own error.
        with mps_ext.overrides.enabled("cpu"), pytest.raises(RuntimeError, match=re.escape(str(theirs.value))):
            F.linear(*args)
    # Types the kernels do not take go to torch.
    xd, wd = x.double(), w.double()
    with mps_ext.trace() as t:
        assert torch.equal(mps_ext.linear(xd, wd), F.linear(xd, wd))
    assert t.kernels == []


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gradients(device, dtype):
    x, w, b = data(2, 1, 40, dtype=dtype), data(12, 40, dtype=dtype, seed=1), data(12, dtype=dtype, seed=2)
    g = data(2, 1, 12, dtype=dtype, seed=3)
    ours = [t.to(device).requires_grad_() for t in (x, w, b)]
    (mps_ext.linear(*ours) * g.to(device)).sum().backward()
    theirs = [t.detach().float().requires_grad_() for t in (x, w, b)]
    (F.linear(*theirs) * g.float()).sum().backward()
    for a, e in zip(ours, theirs):
        assert_close(a.grad.cpu(), e.grad.to(dtype), scale=4)


def test_opcheck():
    torch.library.opcheck(torch.ops.mps_ext.linear.default, (data(16), data(5, 16, seed=1), None))
    args = [t.requires_grad_() for t in (data(2, 1, 16), data(5, 16, seed=1), data(5, seed=2))]
    torch.library.opcheck(torch.ops.mps_ext.linear.default, args)


class Recorder(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls.append((str(func), args))
        return func(*args, **(kwargs or {}))


def decode_step(batch=2):
    """transformers' own Qwen2 model (bias on q/k/v, none on o_proj and the MLP, as Qwen2 has them), one layer
    of a tiny config with random weights, after a 5-token prompt: a function running one decode step of
    ``batch`` sequences (one token each) over the prompt's cache, and the model."""
    transformers = pytest.importorskip("transformers")
    config = transformers.Qwen2Config(hidden_size=64, intermediate_size=96, num_hidden_layers=1, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=50, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():  # biases too, which the initialisation leaves at zero
            p.copy_(torch.randn(p.shape) * 0.2)
    prompt = torch.randint(0, 50, (batch, 5))
    with torch.no_grad():
        cache = model(prompt, use_cache=True).cache

    def step():
        import copy

        return model(torch.randint(0, 50, (batch, 1), generator=torch.Generator().manual_seed(1)),
                     cache=copy.deepcopy(cache), use_cache=True).logits

    return step, model


class TestOverrides:
    def test_what_a_decoder_step_sends(self):
        # Without overrides the CPU key decomposes F.linear: every projection
        # arrives as mm (no bias) or addmm (bias) with the weight as a
        # transposed view of a row-major matrix, on [B * 1, K] rows: q/k/v with
        # bias, o_proj, gate/up/down and lm_head without.
        step, _ = decode_step()
        with torch.no_grad(), Recorder() as r:
            step()
        mms = [(f, a) for f, a in r.calls if f in ("aten.mm.default", "aten.addmm.default")]
        assert "aten.linear.default" not in [f for f, _ in r.calls]
        assert sorted(f for f, _ in mms) == ["aten.addmm.default"] * 3 + ["aten.mm.default"] * 5
        for f, a in mms:
            mat1, mat2 = a[-2], a[-1]
            assert mat1.shape[0] == 2 and mat2.stride(0) == 1 and mat2.t().is_contiguous()
        # With overrides, linear has a CPU kernel and arrives whole.
        with torch.no_grad(), mps_ext.overrides.enabled("cpu"), Recorder() as r:
            step()
        assert [f for f, _ in r.calls].count("aten.linear.default") == 8

    def test_decoder_step_output_and_gradients(self):
        step, model = decode_step()
        step().square().sum().backward()
        want_out = step().detach()
        want = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        mps_ext.overrides.reset_stats()
        with mps_ext.overrides.enabled("cpu"), mps_ext.trace() as t:
            out = step()
            out.square().sum().backward()
        assert_close(out.detach(), want_out, scale=4)
        for p, exp in zip(model.parameters(), want):
            assert_close(p.grad, exp, scale=4)
        # The forward's 8 projections; the backward's input gradients g @ W read W k-major; the attention (its
        # input needs a derivative) in the training kernels.
        assert sorted(set(t.names)) == ["attention_backward_dkv_float_d32", "attention_backward_dq_float_d32",
                                        "attention_prefill_float_d32", "gemv_dense_m2_r2_float", "gemv_t_m2_float"]
        assert t.names.count("gemv_dense_m2_r2_float") == 8
        s = mps_ext.overrides.stats()
        assert s["aten::linear"] == {"hits": 8, "fallbacks": 0, "reasons": {}}

    @pytest.mark.fallback("rows > 8")
    def test_nn_linear_gradients_unchanged(self):
        for shape, bias in (((3, 20), True), ((2, 1, 20), False), ((20,), True), ((12, 20), True)):
            lin = torch.nn.Linear(20, 9, bias=bias)
            x = torch.randn(shape, requires_grad=True)
            lin(x).sin().sum().backward()
            want = [x.grad.clone()] + [p.grad.clone() for p in lin.parameters()]
            x.grad = None
            lin.zero_grad()
            with mps_ext.overrides.enabled("cpu"):
                lin(x).sin().sum().backward()
            for got, exp in zip([x.grad] + [p.grad for p in lin.parameters()], want):
                assert_close(got, exp, scale=2)

    def test_linear_mm_addmm_run_the_kernels(self):
        x, w, b = data(3, 64), data(20, 64, seed=1), data(20, seed=2)
        mps_ext.overrides.reset_stats()
        with mps_ext.overrides.enabled("cpu"), mps_ext.trace() as t:
            got = [F.linear(x, w, b), x @ w.T, torch.addmm(b, x, w.t()), torch.addmm(b.expand(3, 20), x, w.t())]
        assert t.names == ["gemv_dense_m4_r2_float"] * 4
        for g in got[:1] + got[2:]:
            assert_close(g, F.linear(x, w, b), scale=2)
        assert_close(got[1], x @ w.T, scale=2)
        s = mps_ext.overrides.stats()
        assert s["aten::linear"]["hits"] == 1 and s["aten::mm"]["hits"] == 1 and s["aten::addmm"]["hits"] == 2

    @pytest.mark.fallback("beta or alpha != 1|rows > 8|dtype Double|neither row- nor column-major")
    def test_fallbacks_are_counted(self):
        x, w, b = data(9, 64), data(20, 64, seed=1), data(20, seed=2)
        mps_ext.overrides.reset_stats()
        with mps_ext.overrides.enabled("cpu"), mps_ext.trace() as t:
            got = [F.linear(x, w, b), x[:2] @ data(128, 40)[::2, ::2], torch.addmm(b, x[:2], w.t(), beta=2),
                   F.linear(x[:2].double(), w.double())]
        assert t.kernels == []
        assert_close(got[0], F.linear(x, w, b), scale=2)
        assert_close(got[2], torch.addmm(b, x[:2], w.t(), beta=2), scale=2)
        s = mps_ext.overrides.stats()
        assert s["aten::linear"]["reasons"] == {"rows > 8": 1, "dtype Double": 1}
        assert s["aten::mm"]["reasons"] == {"weight neither row- nor column-major": 1}
        assert s["aten::addmm"]["reasons"]["beta or alpha != 1"] == 1

    def test_conv1d_layouts_run_the_k_major_kernels(self):
        # x @ W and addmm(b, x, W) with W (in, out) row-major, as transformers' Conv1D (GPT-2) computes, and
        # W.T @ v, reach the gemv_t kernels.
        x, w, b = data(3, 64), data(64, 20, seed=1), data(20, seed=2)
        mps_ext.overrides.reset_stats()
        with mps_ext.overrides.enabled("cpu"), mps_ext.trace() as t:
            got = [x @ w, torch.addmm(b, x, w), w.T @ x[0]]
        assert t.names == ["gemv_t_m4_float", "gemv_t_m4_float", "gemv_t_m1_float"]
        for g, want in zip(got, [x @ w, torch.addmm(b, x, w), w.T @ x[0]]):
            assert_close_dot(g, want, g.abs() + 1, 64)
        s = mps_ext.overrides.stats()
        assert s["aten::mm"]["hits"] == s["aten::addmm"]["hits"] == s["aten::mv"]["hits"] == 1

    @pytest.mark.fallback("rows > 8")
    def test_one_count_per_call_and_backward_counted_as_such(self):
        x, w, b = data(9, 64).requires_grad_(), data(20, 64, seed=1), data(20, seed=2)
        mps_ext.overrides.reset_stats()
        with mps_ext.overrides.enabled("cpu"):
            F.linear(x, w, b).sum().backward()
            F.linear(x[:1].detach(), w)
        s = mps_ext.overrides.stats()
        # The 9-row linear's decomposition into addmm is part of that call.
        assert s.keys() == {"aten::linear", "aten::mm (backward)"}
        assert s["aten::linear"] == {"hits": 1, "fallbacks": 1, "reasons": {"rows > 8": 1}}
        # x's gradient, grad @ w, has the 9 rows too.
        assert s["aten::mm (backward)"] == {"hits": 0, "fallbacks": 1, "reasons": {"rows > 8": 1}}

    @pytest.mark.parametrize("dtype", DTYPES)
    def test_matrix_vector_products_run_the_kernels(self, device, dtype):
        # W @ v reaches aten::mv (torch.matmul of a matrix and a vector too), torch.addmv aten::addmv; the
        # vector is the one row of x, the matrix the weight. A strided vector and one with the negative bit
        # (resolved before the kernel) take the kernels as well.
        w, b = data(67, 300, dtype=dtype, seed=1), data(67, dtype=dtype, seed=2)
        v2 = data(600, dtype=dtype)
        v = v2[::2]
        calls = [lambda w, v, b: w @ v, lambda w, v, b: torch.mv(w, v), lambda w, v, b: torch.matmul(w, v),
                 lambda w, v, b: torch.addmv(b, w, v), lambda w, v, b: torch.mv(w, v._neg_view())]
        want = [f(w, v, b) for f in calls]
        mps_ext.overrides.reset_stats()
        with mps_ext.overrides.enabled(device), mps_ext.trace() as t:
            got = [f(w.to(device), v.to(device), b.to(device)).cpu() for f in calls]
        assert len(t.names) == 5 and all(re.fullmatch(rf"gemv_dense_m1_r[12]_{TYPE[dtype]}", n) for n in t.names)
        assert {k.backend for k in t.kernels} == {backend(device)}
        for g, w_ in zip(got, want):
            assert g.dtype == dtype and g.shape == (67,)
            magnitude = w.float().abs() @ v.float().abs() + b.float().abs()
            assert_close_dot(g, w_, magnitude, 300)
        s = mps_ext.overrides.stats()
        assert s["aten::mv"]["hits"] == 4 and s["aten::addmv"]["hits"] == 1

    @pytest.mark.fallback("neither row- nor column-major|beta or alpha != 1|self not a bias row|dtype Double|empty")
    def test_matrix_vector_fallbacks_are_counted(self):
        w, v, b = data(20, 64, seed=1), data(64), data(20, seed=2)
        calls = [lambda: data(40, 128)[::2, ::2] @ v, lambda: torch.addmv(b, w, v, beta=2),
                 lambda: torch.addmv(b[:1].squeeze(), w, v), lambda: w.double() @ v.double(),
                 lambda: w[:0] @ v]
        want = [f() for f in calls]
        mps_ext.overrides.reset_stats()
        with mps_ext.overrides.enabled("cpu"), mps_ext.trace() as t:
            got = [f() for f in calls]
        assert t.kernels == []
        for g, w_ in zip(got, want):
            assert torch.equal(g, w_)  # torch's own kernels
        s = mps_ext.overrides.stats()
        assert s["aten::mv"]["reasons"] == {"weight neither row- nor column-major": 1, "dtype Double": 1, "empty": 1}
        assert s["aten::addmv"]["reasons"] == {"beta or alpha != 1": 1, "self not a bias row": 1}

    @pytest.mark.fallback("shape mismatch|mixed dtypes|not a matrix and a vector|bias not 1-D")
    def test_matrix_vector_errors_like_torch(self):
        w, v = data(20, 64, seed=1), data(64)
        for call in (lambda: torch.mv(w, v[:10]), lambda: torch.mv(w.half(), v), lambda: torch.mv(w, w),
                     lambda: torch.addmv(data(3), w, v), lambda: torch.addmv(data(20).half(), w, v)):
            assert_raises_like(lambda: with_cpu_overrides(call), call)

    def test_matrix_vector_gradients_in_both_modes(self):
        w, v, b = data(20, 64, seed=1) / 8, data(64), data(20, seed=2)  # dot products of order 1
        tangents = data(20, 64, seed=3), data(64, seed=4), data(20, seed=5)

        def f(w, v, b):
            return (torch.addmv(b, w, v) * (w @ v)).sin()

        want = torch.func.jvp(f, (w, v, b), tangents), torch.func.grad(lambda *a: f(*a).sum(), (0, 1, 2))(w, v, b)
        with mps_ext.overrides.enabled("cpu"), mps_ext.trace() as t:
            got = torch.func.jvp(f, (w, v, b), tangents), torch.func.grad(lambda *a: f(*a).sum(), (0, 1, 2))(w, v, b)
        # Each forward pass runs both products as GEMVs, the backward's W^T g the k-major one.
        assert t.names.count("gemv_dense_m1_r2_float") >= 4 and "gemv_t_m1_float" in t.names
        for g, w_ in zip([*got[0], *got[1]], [*want[0], *want[1]]):
            assert_close(g, w_, scale=4)

    def test_gpt2_decode_runs_the_k_major_kernels(self):
        # transformers' GPT-2 (tiny config, random weights): its Conv1D projections call addmm(b, x, W) with W
        # (in, out) row-major, four per layer, and lm_head is an nn.Linear. Greedy decode gives torch's tokens.
        transformers = pytest.importorskip("transformers")
        config = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=2, vocab_size=128, n_positions=64,
                                         bos_token_id=0, eos_token_id=0)
        model = transformers.GPT2LMHeadModel(config).eval()
        assert isinstance(model.transformer.h[0].attn.c_attn, transformers.pytorch_utils.Conv1D)
        ids = torch.randint(0, 128, (1, 6), generator=torch.Generator().manual_seed(0))
        want = model.generate(ids, max_new_tokens=8, do_sample=False)
        mps_ext.overrides.reset_stats()
        with mps_ext.overrides.enabled("cpu"), mps_ext.trace() as t:
            got = model.generate(ids, max_new_tokens=8, do_sample=False)
        assert torch.equal(got, want)
        # The 6-token prefill (8 rows at most) and 7 single-token steps, each 2 layers x 4 Conv1D, and lm_head.
        assert t.names.count("gemv_t_m8_float") == 8 and t.names.count("gemv_t_m1_float") == 7 * 8
        assert t.names.count("gemv_dense_m1_r2_float") == 8
        s = mps_ext.overrides.stats()
        assert s["aten::addmm"] == {"hits": 64, "fallbacks": 0, "reasons": {}}

    def test_mps_override_runs_the_metal_kernels(self, device):
        if device != "mps":
            pytest.skip("needs a usable MPS device")
        x, w = data(1, 256), data(512, 256, seed=1)
        with mps_ext.overrides.enabled("mps"), mps_ext.trace() as t:
            got = F.linear(x.to("mps"), w.to("mps"))
        assert re.fullmatch(r"gemv_dense_m1_r[12]_float", t.names[0]) and t.kernels[0].backend == "metal"
        assert_close(got.cpu(), F.linear(x, w), scale=8)


@pytest.mark.parametrize("dtype", DTYPES)
def test_checked_mode_on_every_variant(dtype):
    with mps_ext.sim.checked():
        w, b = data(21, 200, dtype=dtype, seed=1), data(21, dtype=dtype, seed=2)
        for rows in (1, 2, 3, 7):
            x = data(rows, 200, dtype=dtype)
            check(x, w, b, kernel="dense")  # 16-byte loads, K tail
            check(x[:, 1:], w[:, 1:], kernel="dense")  # element loads
            check(data(rows, 2100, dtype=dtype), data(5, 2100, dtype=dtype, seed=1), kernel="splitk")
        check(data(2, 3, dtype=dtype), data(3, 3, dtype=dtype), data(3, dtype=dtype))
        with mps_ext.sim.gpu_cores(1):  # 32 SIMD groups: 40 rows fill it, one per SIMD group
            check(data(1, 200, dtype=dtype), data(40, 200, dtype=dtype, seed=1), kernel="dense_m1_r1")
