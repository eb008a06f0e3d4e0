"""Scaled dot-product attention (F.scaled_dot_product_attention; on mps
aten::_scaled_dot_product_attention_math_for_mps) with the overrides on, against torch's CPU math attention in
float64: decode query lengths (1-8) and prefill (more rows, the block kernel) over GQA and broadcast heads, batch broadcasting (an error on mps with torch
2.13 and 2.14), head dims 32-256 with value head dims of their own, bool and additive masks of every float dtype
and broadcast shape, causal (top-left) with and without a mask, rows that attend no key, no keys at all, views
(transposed, expanded K/V), NaN and inf; the simulator's checked mode; torch's errors and derivatives; a
transformers Llama decoding the same tokens."""

import contextlib
import math
import random

import pytest
import torch
import torch.nn.functional as F

import mps_ext
from conftest import backend, on, ran_kernels
from tolerances import TOLERANCES, assert_close, reduction_scale

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def randn(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)


def reference(q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False):
    """torch's CPU math attention in float64 (bool masks as the 0 / -inf it adds). torch's math path rejects
    a mask with causal; its flash path (4-D inputs) applies both, and gives the reference there."""
    wide = [t.double() for t in (q, k, v)]
    if attn_mask is not None and is_causal:
        mask = attn_mask if attn_mask.dtype == torch.bool else attn_mask.double()
        return F.scaled_dot_product_attention(*wide, attn_mask=mask, is_causal=True, scale=scale,
                                              enable_gqa=enable_gqa)
    if attn_mask is not None:
        attn_mask = (torch.zeros(attn_mask.shape, dtype=torch.float64).masked_fill(~attn_mask, -math.inf)
                     if attn_mask.dtype == torch.bool else attn_mask.double())
    return torch.ops.aten._scaled_dot_product_attention_math(*wide, attn_mask, 0.0, is_causal, scale=scale,
                                                             enable_gqa=enable_gqa)[0]


def sdpa_on(device, q, k, v, **kwargs):
    """F.scaled_dot_product_attention on ``device`` with the overrides on, and the kernels it ran."""
    mask = kwargs.pop("attn_mask", None)
    with mps_ext.overrides.enabled(device), mps_ext.trace() as t:
        out = on(device, lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m, **kwargs),
                 q, k, v, mask)
    assert all(r.backend == backend(device) for r in t.kernels), t.names
    return out, t


def average_floor(v):
    """A weighted average of the keys' values in float32 is off by about sqrt(keys) * eps * max |v| however
    small it comes out (values that cancel): that much absolute error in every dtype."""
    finite = v[v.isfinite()].abs()
    return 4 * v.size(-2) ** 0.5 * 2.0**-24 * float(finite.max()) if finite.numel() else 0.0


def check(device, q, k, v, **kwargs):
    """Our attention is torch's within the dtype's tolerance, and ran the decode kernel (and the merge where
    the keys were split) for up to 8 query rows, the prefill kernel for more."""
    want = reference(q, k, v, **kwargs)
    got, t = sdpa_on(device, q, k, v, **kwargs)
    assert got.shape == want.shape and got.dtype == q.dtype, (got.shape, want.shape, got.dtype)
    # float32 scores of size s carry exp's relative error s * eps into the weights (scale=1 gives sqrt(d)).
    score = (kwargs.get("scale") or q.size(-1) ** -0.5) * q.size(-1) ** 0.5
    widen = max(1.0, score) if q.dtype == torch.float32 else 1.0
    assert_close(got, want, scale=2 * reduction_scale(q.dtype, q.size(-1)) * widen, atol=average_floor(v))
    if k.size(-2) and got.numel() and q.size(-2) > 8:
        assert len(t.names) == 1 and t.names[0].startswith("attention_prefill_"), t.names
    elif k.size(-2) and got.numel():
        assert t.names[0].startswith("attention_decode_") and all(
            n.startswith("attention_merge_") for n in t.names[1:]), t.names
    else:
        assert t.names == [], t.names
    return got, t


def test_llama3_decode_reads_each_kv_head_once(device):
    # 32 query heads over 8 KV heads, d 128: one threadgroup block of the 4 query heads per KV head, the keys
    # split over threadgroups (grid x) and merged.
    q, k, v = randn(1, 32, 1, 128, dtype=torch.bfloat16), randn(1, 8, 700, 128, dtype=torch.bfloat16, seed=1), \
        randn(1, 8, 700, 128, dtype=torch.bfloat16, seed=2)
    _, t = check(device, q, k, v, enable_gqa=True, scale=0.1)
    decode = t.kernels[0]
    assert decode.name == "attention_decode_bfloat_e4_r4" and t.names[1] == "attention_merge_bfloat_e4", t.names
    assert decode.grid[1:] == (1, 8) and decode.grid[0] > 1, decode.grid


def test_a_long_cache_merges_many_runs(device):
    # 20,000 keys split over more runs than a SIMD group has lanes: the merge's SIMD groups take the runs in
    # turn and add their sums in a fixed order, the same bits every call (in the simulator's checked mode).
    q, k, v = randn(1, 4, 1, 64), randn(1, 1, 20000, 64, seed=1), randn(1, 1, 20000, 64, seed=2)
    with mps_ext.sim.checked() if device == "cpu" else contextlib.nullcontext():
        got, t = check(device, q, k, v, enable_gqa=True)
    assert t.names[1] == "attention_merge_float_e2" and t.kernels[0].grid[0] > 32, [(r.name, r.grid) for r in t.kernels]
    again, _ = check(device, q, k, v, enable_gqa=True)
    assert torch.equal(got, again)


@pytest.mark.parametrize("q_len", [3, 40])
@pytest.mark.parametrize("dim", [32, 40, 48, 64, 72, 80, 96, 112, 128, 160, 192, 256])
def test_head_dims(device, dim, q_len):
    check(device, randn(2, 4, q_len, dim), randn(2, 2, 70, dim, seed=1), randn(2, 2, 70, dim, seed=2),
          enable_gqa=True)


@pytest.mark.parametrize("q_len", [2, 20])
@pytest.mark.parametrize("dims", [(192, 128), (64, 32), (40, 256)])
def test_value_head_dim_of_its_own(device, dims, q_len):
    qk, vd = dims
    check(device, randn(1, 2, q_len, qk), randn(1, 2, 50, qk, seed=1), randn(1, 2, 50, vd, seed=2))


@pytest.mark.parametrize("q_len", [3, 37])
@pytest.mark.parametrize("dtype", DTYPES)
def test_masks(device, dtype, q_len):
    q, k, v = randn(2, 4, q_len, 64, dtype=dtype), randn(2, 4, 90, 64, dtype=dtype, seed=1), \
        randn(2, 4, 90, 64, dtype=dtype, seed=2)
    bool_mask = randn(2, 1, q_len, 90, seed=3) > -0.5
    check(device, q, k, v, attn_mask=bool_mask)
    check(device, q, k, v, attn_mask=randn(90, seed=4) > 0)  # broadcast over everything but the keys
    check(device, q, k, v, attn_mask=randn(1, 4, 1, 90, seed=5))  # float32 with any query dtype
    check(device, q, k, v, attn_mask=randn(q_len, 90, dtype=dtype, seed=6))


# Prefill: whole blocks, a block and a bit, more rows than keys (rows past the keys attend all of them).
@pytest.mark.parametrize("q_len, keys", [(4, 4), (3, 50), (8, 5), (32, 32), (33, 70), (50, 20)])
def test_causal_is_top_left(device, q_len, keys):
    q, k, v = randn(1, 2, q_len, 64), randn(1, 2, keys, 64, seed=1), randn(1, 2, keys, 64, seed=2)
    check(device, q, k, v, is_causal=True)
    check(device, q, k, v, is_causal=True, attn_mask=randn(1, 1, q_len, keys, seed=3) > -1)


@pytest.mark.parametrize("q_len", [3, 12])
def test_rows_that_attend_no_key_are_zero(device, q_len):
    q, k, v = randn(1, 2, q_len, 64), randn(1, 2, 140, 64, seed=1), randn(1, 2, 140, 64, seed=2)
    mask = torch.ones(q_len, 140, dtype=torch.bool)
    mask[1] = False
    got, _ = check(device, q, k, v, attn_mask=mask)
    assert (got[:, :, 1] == 0).all()
    float_mask = torch.zeros(q_len, 140)
    float_mask[2] = -math.inf
    got, _ = check(device, q, k, v, attn_mask=float_mask)
    assert (got[:, :, 2] == 0).all()


@pytest.mark.parametrize("q_len", [1, 20])
def test_no_keys(device, q_len):
    got, _ = check(device, randn(2, 4, q_len, 64), randn(2, 4, 0, 64), randn(2, 4, 0, 48))
    assert got.shape == (2, 4, q_len, 48) and (got == 0).all()


def test_batch_broadcasting(device):
    # torch 2.13 and 2.14 on mps: "shape '[1, 1, 64]' is invalid for input of size 128".
    got, _ = check(device, randn(1, 1, 64), randn(2, 1, 1, 64, seed=1), randn(2, 1, 1, 64, seed=2))
    assert got.shape == (2, 1, 1, 64)
    check(device, randn(3, 1, 4, 2, 32), randn(1, 2, 4, 20, 32, seed=1), randn(3, 2, 1, 20, 32, seed=2))
    check(device, randn(2, 8, 1, 64), randn(2, 1, 33, 64, seed=1), randn(2, 1, 33, 64, seed=2))  # one KV head


@pytest.mark.parametrize("q_len", [1, 16])
def test_views_are_read_in_place(device, q_len):
    # transformers' layout: (batch, seq, heads, dim) transposed; repeat_kv's K/V expanded over the group.
    q = randn(2, q_len, 8, 64).transpose(1, 2)
    k = randn(2, 40, 2, 64, seed=1).transpose(1, 2)[:, :, None].expand(2, 2, 4, 40, 64).flatten(1, 2)
    v = randn(2, 2, 1, 40, 64, seed=2).expand(2, 2, 4, 40, 64)[:, :, :, :, :].reshape(2, 8, 40, 64)
    check(device, q, k, v)
    k_expanded = randn(2, 1, 40, 64, seed=3).expand(2, 8, 40, 64)
    check(device, q, k_expanded, k_expanded[..., ::2])


@pytest.mark.parametrize("q_len", [3, 20])
def test_nan_and_inf(device, q_len):
    q, k, v = randn(1, 2, q_len, 64), randn(1, 2, 150, 64, seed=1), randn(1, 2, 150, 64, seed=2)
    q[0, 0, 1, 5] = math.nan
    k[0, 1, 7, 3] = math.inf
    v[0, 1, 100, 0] = -math.inf
    check(device, q, k, v)


@pytest.mark.parametrize("seed", range(24))
def test_random_grid(device, seed):
    rng = random.Random(seed)
    dtype = rng.choice(DTYPES)
    kv_heads = rng.choice([1, 2, 3])
    group = rng.choice([1, 2, 4])
    q_len, keys = rng.choice([rng.randint(1, 8), rng.randint(9, 70)]), rng.choice([0, 1, 7, 33, 130, 300])
    dim = rng.choice([32, 40, 64, 80, 96, 128, 160, 256])
    v_dim = dim if rng.random() < 0.7 else rng.choice([16, 64, 128])
    batch = rng.choice([(), (2,), (1, 3)])
    q = randn(*batch, kv_heads * group, q_len, dim, dtype=dtype, seed=seed)
    k = randn(*batch, kv_heads, keys, dim, dtype=dtype, seed=seed + 1)
    v = randn(*batch, kv_heads, keys, v_dim, dtype=dtype, seed=seed + 2)
    if rng.random() < 0.3:
        q = q.transpose(-2, -3).contiguous().transpose(-2, -3)
    kwargs = {"enable_gqa": group > 1, "scale": rng.choice([None, 0.05, 1.0])}
    kind = rng.choice(["none", "bool", "float", "own", "causal"])
    mask_shape = rng.choice([(q_len, keys), (kv_heads * group, 1, keys), (1,) * len(batch) + (1, q_len, keys)])
    if kind == "bool":
        kwargs["attn_mask"] = randn(*mask_shape, seed=seed + 3) > -0.8
    elif kind in ("float", "own"):
        kwargs["attn_mask"] = randn(*mask_shape, dtype=torch.float32 if kind == "float" else dtype, seed=seed + 3)
    elif kind == "causal":
        kwargs["is_causal"] = True
    check(device, q, k, v, **kwargs)


def test_checked_mode(device):
    if device != "cpu":
        pytest.skip("the simulator's checks")
    with mps_ext.sim.checked():
        for dtype in DTYPES:
            q, k, v = randn(1, 8, 2, 80, dtype=dtype), randn(1, 2, 200, 80, dtype=dtype, seed=1), \
                randn(1, 2, 200, 72, dtype=dtype, seed=2)
            check(device, q, k, v, enable_gqa=True, attn_mask=randn(2, 200, seed=3) > 0)
            check(device, q[:, :1, :1, :40], k[:, :1, :9, :40], v[:, :1, :9, :40], is_causal=True)
            q = randn(1, 4, 45, 80, dtype=dtype)
            check(device, q, k, v, enable_gqa=True, attn_mask=randn(45, 200, dtype=dtype, seed=4))
            check(device, q[..., :40], k[..., :40], v[..., :40], enable_gqa=True, is_causal=True)


def test_prefill_blocks(device):
    # One threadgroup per 32 query rows of each query head and batch; a causal block reads only the keys up
    # to its last row (the rows' results above show it reads all it needs).
    q, k, v = randn(3, 4, 70, 64), randn(3, 2, 90, 64, seed=1), randn(3, 2, 90, 64, seed=2)
    _, t = check(device, q, k, v, enable_gqa=True, is_causal=True)
    assert t.kernels[0].name == "attention_prefill_float_d64" and t.kernels[0].grid == (3, 4, 3), t.kernels[0]
    assert t.kernels[0].threadgroup == (128, 1, 1)


@pytest.mark.fallback("dtype Double")
def test_float64_is_torchs(device):
    if device == "mps":
        pytest.skip("mps has no float64")
    q, k, v = randn(1, 2, 1, 64, dtype=torch.float64), randn(1, 2, 9, 64, dtype=torch.float64, seed=1), \
        randn(1, 2, 9, 64, dtype=torch.float64, seed=2)
    got, t = sdpa_on(device, q, k, v)
    assert t.names == [] and torch.equal(got, F.scaled_dot_product_attention(q, k, v))


@pytest.mark.fallback("invalid arguments")
@pytest.mark.parametrize("case", ["head dims", "gqa heads", "heads", "mask dtype", "mask shape", "causal mask 3-D"])
def test_torchs_errors(device, case):
    q, k, v = randn(1, 4, 1, 64), randn(1, 2, 9, 64, seed=1), randn(1, 2, 9, 64, seed=2)
    kwargs = {}
    if case == "head dims":
        k = k[..., :32]
    elif case == "gqa heads":
        q, kwargs = randn(1, 3, 1, 64), {"enable_gqa": True}
    elif case == "heads":
        pass  # 4 query heads, 2 KV heads, no enable_gqa
    elif case == "mask dtype":
        q, kwargs = q[:, :2], {"attn_mask": torch.zeros(1, 9, dtype=torch.int32)}
    elif case == "mask shape":
        q, kwargs = q[:, :2], {"attn_mask": torch.zeros(3, 9)}
    else:
        q, k, v, kwargs = q[0, :2], k[0], v[0], {"attn_mask": torch.ones(1, 9, dtype=torch.bool), "is_causal": True}
    with pytest.raises(RuntimeError) as want:
        F.scaled_dot_product_attention(q, k, v, **kwargs)
    if device == "mps":
        pytest.skip("torch's mps messages differ from its CPU's")
    with pytest.raises(RuntimeError) as got:
        sdpa_on(device, q, k, v, **kwargs)
    assert str(got.value) == str(want.value)


def assert_close_gradients(got, want, dtype):
    """Gradients are sums of products of rounded inputs (and of the rounded output, through delta = dout . out,
    which cancels where a row's weights barely depend on it): within a few of the dtype's epsilons of the largest
    gradient, however small an element comes out (one key's softmax has exactly zero dq and dk)."""
    largest = max(float(w.abs().max()) for w in want if w.numel())
    for g, w in zip(got, want):
        assert g.dtype == dtype and g.shape == w.shape, (g.dtype, g.shape, w.shape)
        assert_close(g, w, atol=4 * TOLERANCES[dtype][0] * largest, scale=4)


def training_step(device, q, k, v, dout, **kwargs):
    """F.scaled_dot_product_attention with grad on ``device`` (the overrides on): the output, the gradients of
    q, k, v for ``dout``, and the kernels that ran."""
    mask = kwargs.pop("attn_mask", None)
    leaves = [t.to(device).requires_grad_() for t in (q, k, v)]
    with mps_ext.overrides.enabled(device), mps_ext.trace() as t:
        out = F.scaled_dot_product_attention(*leaves, attn_mask=None if mask is None else mask.to(device), **kwargs)
        grads = torch.autograd.grad(out, leaves, dout.to(device))
    return out, grads, t


def reference_step(q, k, v, dout, **kwargs):
    wide = [t.double().requires_grad_() for t in (q, k, v)]
    out = reference(*wide, **kwargs)
    return out, torch.autograd.grad(out, wide, dout.double())


@pytest.mark.parametrize("seed", range(12))
def test_training_runs_the_backward_kernels(device, seed):
    # The forward saves each row's log-sum-exp; the backward recomputes the probabilities (dq over the keys,
    # dk and dv over every query head of the KV head: GQA's sum).
    rng = random.Random(seed)
    dtype = rng.choice(DTYPES)
    kv_heads, group = rng.choice([1, 2]), rng.choice([1, 2, 4])
    q_len, keys = rng.choice([1, 5, 33, 40]), rng.choice([1, 9, 45, 70])
    dim = rng.choice([16, 32, 40, 64, 80, 128])
    v_dim = dim if rng.random() < 0.7 else rng.choice([16, 64])
    q = randn(2, kv_heads * group, q_len, dim, dtype=dtype, seed=seed)
    k, v = randn(2, kv_heads, keys, dim, dtype=dtype, seed=seed + 1), randn(2, kv_heads, keys, v_dim, dtype=dtype,
                                                                            seed=seed + 2)
    dout = randn(2, kv_heads * group, q_len, v_dim, dtype=dtype, seed=seed + 3)
    kwargs = {"enable_gqa": group > 1, "scale": rng.choice([None, 0.3])}
    kind = rng.choice(["none", "causal", "bool", "float"])
    if kind == "causal":
        kwargs["is_causal"] = True
    elif kind != "none":
        mask = randn(q_len, keys, seed=seed + 4)
        kwargs["attn_mask"] = mask > -1 if kind == "bool" else mask.to(dtype)
    out, grads, t = training_step(device, q, k, v, dout, **kwargs)
    want_out, want = reference_step(q, k, v, dout, **kwargs)
    assert_close(out.detach(), want_out, scale=2 * reduction_scale(dtype, dim), atol=average_floor(v))
    assert_close_gradients(grads, want, dtype)
    assert [n.rsplit("_", 2)[0] for n in t.names] == ["attention_prefill", "attention_backward_dq",
                                                      "attention_backward_dkv"], t.names


def test_training_with_broadcast_batch_and_heads_sums_their_gradients(device):
    # q broadcast over k's batch, one KV head for all: their gradients sum over what broadcast.
    q, k, v = randn(1, 4, 20, 32), randn(3, 1, 30, 32, seed=1), randn(3, 1, 30, 32, seed=2)
    dout = randn(3, 4, 20, 32, seed=3)
    out, grads, t = training_step(device, q, k, v, dout)
    want_out, want = reference_step(q, k, v, dout)
    assert_close_gradients(grads, want, torch.float32)
    assert "attention_backward_dkv_float_d32" in t.names, t.names


def test_double_backward_raises():
    # A backward that must build a graph of its own (create_graph: double backward) is refused, not wrong.
    q, k, v = (randn(1, 2, 10, 32, seed=s).requires_grad_() for s in range(3))
    with mps_ext.overrides.enabled("cpu"):
        out = F.scaled_dot_product_attention(q, k, v)
        with pytest.raises(RuntimeError, match=r"not differentiable \(double backward\)"):
            torch.autograd.grad(out.sum(), q, create_graph=True)


@pytest.mark.fallback(r"^autograd: (backward head dim > 128|dropout)$")
def test_training_past_the_kernels_is_torchs_math():
    q, k, v = (randn(1, 2, 10, 192, seed=s).requires_grad_() for s in range(3))
    with mps_ext.overrides.enabled("cpu"), mps_ext.trace() as t:
        out = F.scaled_dot_product_attention(q, k, v)
        grads = torch.autograd.grad(out.sum(), (q, k, v))
        torch.manual_seed(0)
        F.scaled_dot_product_attention(q[..., :64], k[..., :64], v[..., :64], dropout_p=0.5)
    assert not any(n.startswith("attention_") for n in t.names), t.names
    want = torch.autograd.grad(F.scaled_dot_product_attention(q, k, v).sum(), (q, k, v))
    for g, w in zip(grads, want):
        assert torch.equal(g, w)
    assert mps_ext.overrides.stats()["aten::scaled_dot_product_attention"]["reasons"] == {
        "autograd: backward head dim > 128": 1, "autograd: dropout": 1}


def test_opcheck():
    # The mps op's CPU registration: schema, fake kernel (torch's meta), dynamic shapes.
    q, k, v = randn(2, 4, 2, 64), randn(2, 2, 20, 64, seed=1), randn(2, 2, 20, 32, seed=2)
    with mps_ext.overrides.enabled("cpu"):
        torch.library.opcheck(torch.ops.aten._scaled_dot_product_attention_math_for_mps.default, (q, k, v),
                              {"enable_gqa": True}, test_utils=("test_schema", "test_faketensor"))
        out, scores = torch.ops.aten._scaled_dot_product_attention_math_for_mps(q, k, v, enable_gqa=True)
    assert scores.shape == (2, 4, 2, 20)
    assert_close(out, reference(q, k, v, enable_gqa=True))


@pytest.mark.fallback("rows > 8", required=False)  # the 20-token prompt's projections: GEMM, not GEMV
@pytest.mark.parametrize("prompt_len", [5, 20])
def test_transformers_llama_decodes_the_same_tokens(prompt_len):
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=128,
                                      max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    model.set_attn_implementation("sdpa")
    prompt = torch.randint(0, 128, (1, prompt_len), generator=torch.Generator().manual_seed(1))
    kwargs = {"max_new_tokens": 6, "do_sample": False, "pad_token_id": 0}
    want = model.generate(prompt, **kwargs)
    with mps_ext.overrides.enabled("cpu"), mps_ext.trace() as t:
        got = model.generate(prompt, **kwargs)
    assert torch.equal(got, want), (got, want)
    # The prompt: 4 query heads of a KV head pair's 2 (r8 for 5 rows x 2 heads), or the prefill kernel.
    first = "attention_decode_float_e2_r8" if prompt_len == 5 else "attention_prefill_float_d32"
    assert first in t.names and "attention_decode_float_e2_r2" in t.names, set(t.names)
    assert mps_ext.overrides.stats()["aten::scaled_dot_product_attention"]["hits"] == 2 * 6


# ---------------------------------------------------------------- mps_ext.scaled_dot_product_attention

def window_mask(q_len, keys, window):
    """The bool mask of a sliding window aligned to the end of the keys (row i at key keys - q_len + i)."""
    pos = torch.arange(q_len)[:, None] + keys - q_len
    key = torch.arange(keys)[None, :]
    return (key <= pos) & (key > pos - window)


def op_on(device, q, k, v, **kwargs):
    """mps_ext.scaled_dot_product_attention on ``device`` (no overrides needed), and the kernels it ran."""
    tensors = {name: t for name, t in kwargs.items() if isinstance(t, torch.Tensor)}
    others = {name: t for name, t in kwargs.items() if name not in tensors}
    with mps_ext.trace() as t:
        out = on(device, lambda q, k, v, *ts: mps_ext.scaled_dot_product_attention(
            q, k, v, **dict(zip(tensors, ts)), **others), q, k, v, *tensors.values())
    assert t.names and all(r.backend == backend(device) for r in t.kernels), t.names
    return out, t


@pytest.mark.parametrize("q_len, keys", [(1, 50), (4, 300), (40, 60), (45, 45), (9, 500)])
@pytest.mark.parametrize("window", [1, 5, 64, 1000])
def test_window_skips_the_keys_a_mask_would_exclude(device, q_len, keys, window):
    q, k, v = randn(2, 4, q_len, 64), randn(2, 2, keys, 64, seed=1), randn(2, 2, keys, 64, seed=2)
    want = reference(q, k, v, attn_mask=window_mask(q_len, keys, window), enable_gqa=True)
    got, _ = op_on(device, q, k, v, enable_gqa=True, window=window)
    assert_close(got, want)
    # With a mask of its own and causal (top-left) besides: all three apply.
    mask = randn(q_len, keys, seed=3) > -1
    want = reference(q, k, v, attn_mask=mask & window_mask(q_len, keys, window), is_causal=True, enable_gqa=True)
    got, _ = op_on(device, q, k, v, attn_mask=mask, is_causal=True, enable_gqa=True, window=window)
    assert_close(got, want)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("q_len", [1, 3, 20])
def test_sinks_are_gpt_oss_eager_attention(device, dtype, q_len):
    # gpt-oss's own eager attention (logits, a sink column, softmax, the column dropped) on its own layer.
    gpt_oss = pytest.importorskip("transformers.models.gpt_oss.modeling_gpt_oss")
    config = gpt_oss.GptOssConfig(hidden_size=64, num_attention_heads=8, num_key_value_heads=2, head_dim=64,
                                  num_hidden_layers=1)
    layer = gpt_oss.GptOssAttention(config, layer_idx=0).double().eval()
    with torch.no_grad():
        layer.sinks.copy_(randn(8, seed=4) * 3)
    keys = 130
    q, k, v = randn(1, 8, q_len, 64, dtype=dtype), randn(1, 2, keys, 64, dtype=dtype, seed=1), \
        randn(1, 2, keys, 64, dtype=dtype, seed=2)
    causal = torch.zeros(q_len, keys, dtype=torch.float64).masked_fill(~window_mask(q_len, keys, keys), -math.inf)
    want, _ = gpt_oss.eager_attention_forward(layer, q.double(), k.double(), v.double(), causal, layer.scaling)
    got, _ = op_on(device, q, k, v, attn_mask=causal.to(dtype), scale=layer.scaling, enable_gqa=True,
                   sinks=layer.sinks.detach())
    assert_close(got.transpose(1, 2), want, scale=reduction_scale(dtype, 64))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("q_len", [1, 3, 20])
def test_softcap_is_gemma2_eager_attention(device, dtype, q_len):
    # Gemma-2's own eager attention (scaled logits capped by softcap * tanh(s / softcap), then the mask) on its
    # own layer; a cap of 2 bends every logit of these inputs.
    gemma2 = pytest.importorskip("transformers.models.gemma2.modeling_gemma2")
    config = gemma2.Gemma2Config(hidden_size=64, num_attention_heads=8, num_key_value_heads=2, head_dim=64,
                                 num_hidden_layers=1, attn_logit_softcapping=2.0, query_pre_attn_scalar=16)
    layer = gemma2.Gemma2Attention(config, layer_idx=0).double().eval()
    keys = 70
    q, k, v = randn(1, 8, q_len, 64, dtype=dtype) * 2, randn(1, 2, keys, 64, dtype=dtype, seed=1), \
        randn(1, 2, keys, 64, dtype=dtype, seed=2)
    causal = torch.zeros(q_len, keys, dtype=torch.float64).masked_fill(~window_mask(q_len, keys, keys), -math.inf)
    want, _ = gemma2.eager_attention_forward(layer, q.double(), k.double(), v.double(), causal, scaling=layer.scaling,
                                             softcap=2.0)
    got, _ = op_on(device, q, k, v, attn_mask=causal.to(dtype), scale=layer.scaling, enable_gqa=True, softcap=2.0)
    assert_close(got.transpose(1, 2), want, scale=reduction_scale(dtype, 64))
    uncapped, _ = op_on(device, q, k, v, attn_mask=causal.to(dtype), scale=layer.scaling, enable_gqa=True)
    assert not torch.allclose(uncapped, got, atol=1e-2)  # the cap changes these logits


def test_sinks_take_all_the_weight_of_a_row_that_attends_no_key(device):
    q, k, v = randn(1, 2, 3, 32), randn(1, 2, 40, 32, seed=1), randn(1, 2, 40, 32, seed=2)
    mask = torch.ones(3, 40, dtype=torch.bool)
    mask[1] = False
    got, _ = op_on(device, q, k, v, attn_mask=mask, sinks=torch.tensor([0.5, -2.0]))
    assert (got[:, :, 1] == 0).all() and (got[:, :, 0] != 0).all()


@pytest.mark.parametrize("case", ["window", "sinks rank", "sinks heads", "sinks dtype", "softcap", "softcap inf"])
def test_op_argument_errors(case):
    q, k, v = randn(1, 4, 2, 32), randn(1, 4, 9, 32, seed=1), randn(1, 4, 9, 32, seed=2)
    kwargs, match = {
        "window": ({"window": -3}, "window must be a number of keys"),
        "softcap": ({"softcap": -1.0}, "softcap must be a finite logit cap"),
        "softcap inf": ({"softcap": math.inf}, "softcap must be a finite logit cap"),
        "sinks rank": ({"sinks": torch.zeros(4, 1)}, "sinks must be a 1-D floating tensor"),
        "sinks heads": ({"sinks": torch.zeros(3)}, r"sinks must hold one logit per query head \(4\), got 3"),
        "sinks dtype": ({"sinks": torch.zeros(4, dtype=torch.int64)}, "sinks must be a 1-D floating tensor"),
    }[case]
    with pytest.raises(RuntimeError, match=match):
        mps_ext.scaled_dot_product_attention(q, k, v, **kwargs)


@pytest.mark.parametrize("dtype", DTYPES)
def test_op_training_with_softcap_runs_the_backward_kernels(device, dtype):
    # The cap's derivative, 1 - tanh^2, in both backward kernels; GQA and a causal mask besides.
    q, k, v = randn(1, 4, 13, 32, dtype=dtype) * 3, randn(1, 2, 13, 32, dtype=dtype, seed=1), \
        randn(1, 2, 13, 32, dtype=dtype, seed=2)
    dout = randn(1, 4, 13, 32, dtype=dtype, seed=3)
    leaves = [t.to(device).requires_grad_() for t in (q, k, v)]
    with mps_ext.trace() as t:
        out = mps_ext.scaled_dot_product_attention(*leaves, is_causal=True, enable_gqa=True, softcap=2.0)
        got = [out, *torch.autograd.grad(out, leaves, dout.to(device))]
    got = [g.detach().cpu() for g in got]
    metal = {torch.float32: "float", torch.float16: "half", torch.bfloat16: "bfloat"}[dtype]
    assert {f"attention_backward_dq_{metal}_d32", f"attention_backward_dkv_{metal}_d32"} <= set(t.names), t.names
    qd, kd, vd = (x.double().requires_grad_() for x in (q, k, v))
    scores = torch.tanh(qd @ kd.repeat_interleave(2, 1).mT / math.sqrt(32) / 2.0) * 2.0
    scores = scores.masked_fill(~window_mask(13, 13, 13), -math.inf)
    out = scores.softmax(-1) @ vd.repeat_interleave(2, 1)
    want = [out.detach(), *torch.autograd.grad(out, (qd, kd, vd), dout.double())]
    assert_close_gradients(got, want, dtype)


def test_op_gradients_run_the_backward_kernels():
    q, k, v = (randn(1, 4, 5, 32, seed=s).requires_grad_() for s in range(3))
    sinks = randn(4, seed=3).requires_grad_()
    with mps_ext.trace() as t:
        out = mps_ext.scaled_dot_product_attention(q, k, v, sinks=sinks, window=3)
        grads = torch.autograd.grad(out.sum(), (q, k, v, sinks))
    assert t.names == ["attention_prefill_float_d32", "attention_backward_dq_float_d32",
                       "attention_backward_dkv_float_d32"], t.names
    # The same definition in float64, by hand: scores, the window, the sink column, softmax.
    wide = [t.detach().double().requires_grad_() for t in (q, k, v, sinks)]
    scores = (wide[0] @ wide[1].transpose(-2, -1) / math.sqrt(32)).masked_fill(~window_mask(5, 5, 3), -math.inf)
    logits = torch.cat([scores, wide[3].reshape(1, 4, 1, 1).expand(1, 4, 5, 1)], -1)
    want = torch.softmax(logits, -1)[..., :-1] @ wide[2]
    assert_close(out, want)
    for g, w in zip(grads, torch.autograd.grad(want.sum(), wide)):
        assert_close(g, w)
    assert mps_ext.overrides.stats()["mps_ext::scaled_dot_product_attention"] == {
        "hits": 1, "fallbacks": 0, "reasons": {}}


def test_op_opcheck():
    q, k, v = randn(2, 4, 10, 64), randn(2, 2, 20, 64, seed=1), randn(2, 2, 20, 32, seed=2)
    torch.library.opcheck(torch.ops.mps_ext.scaled_dot_product_attention.default, (q, k, v),
                          {"enable_gqa": True, "sinks": randn(4, seed=3), "window": 7},
                          test_utils=("test_schema", "test_faketensor"))


# ---------------------------------------------------------------- transformers' attn_implementation="mps_ext"

@pytest.mark.parametrize("import_first", ["mps_ext", "transformers"])
def test_registered_with_transformers_in_either_import_order(import_first):
    import subprocess
    import sys

    pytest.importorskip("transformers")
    imports = ["import mps_ext", "import transformers"]
    code = "; ".join((imports if import_first == "mps_ext" else imports[::-1]) + [
        "from transformers.modeling_utils import AttentionInterface",
        "from transformers.masking_utils import AttentionMaskInterface",
        "print('mps_ext' in AttentionInterface._global_mapping, 'mps_ext' in AttentionMaskInterface._global_mapping)"])
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and p.stdout.split() == ["True", "True"], p.stderr


@pytest.mark.fallback("rows > 8", required=False)  # the prompt's projections: GEMM, not GEMV
@pytest.mark.parametrize("model", ["gpt_oss", "gemma2", "mistral", "llama", "qwen3"])
@pytest.mark.parametrize("prompt_len", [5, 12])
def test_transformers_models_decode_the_same_tokens_through_mps_ext(model, prompt_len):
    # gpt-oss (sinks; sliding-window and full layers) and Gemma-2 (logit softcapping; sliding-window and full
    # layers) against their own eager attention, Mistral (a sliding window shorter than the text), Llama and
    # Qwen3 against sdpa.
    transformers = pytest.importorskip("transformers")
    common = dict(hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, vocab_size=128, max_position_embeddings=64, sliding_window=4)
    if model == "gpt_oss":
        config = transformers.GptOssConfig(**common, num_local_experts=4, num_experts_per_tok=2,
                                           layer_types=["sliding_attention", "full_attention"],
                                           rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
        cls, theirs = transformers.GptOssForCausalLM, "eager"
    elif model == "gemma2":
        config = transformers.Gemma2Config(**common, attn_logit_softcapping=2.0, query_pre_attn_scalar=16)
        cls, theirs = transformers.Gemma2ForCausalLM, "eager"
    else:
        configs = {"mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
                   "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
                   "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM)}
        config_class, cls = configs[model]
        config, theirs = config_class(**{**common, "sliding_window": 4 if model == "mistral" else None}), "sdpa"
    torch.manual_seed(0)
    lm = cls(config).eval()
    if model == "gpt_oss":
        with torch.no_grad():
            for layer in lm.model.layers:
                layer.self_attn.sinks.normal_()
    prompt = torch.randint(0, 128, (1, prompt_len), generator=torch.Generator().manual_seed(1))
    kwargs = {"max_new_tokens": 6, "do_sample": False, "pad_token_id": 0}
    lm.set_attn_implementation(theirs)
    want = lm.generate(prompt, **kwargs)
    lm.set_attn_implementation("mps_ext")
    with mps_ext.trace() as t:
        got = lm.generate(prompt, **kwargs)
    assert torch.equal(got, want), (got, want)
    names = set(t.names)
    assert "attention_decode_float_e2_r2" in names, names
    assert ("attention_prefill_float_d32" in names) == (prompt_len > 8), names
    stats = mps_ext.overrides.stats()["mps_ext::scaled_dot_product_attention"]
    steps = got.shape[1] - prompt_len  # up to 6: an end-of-text token stops generate early
    assert stats["hits"] == 2 * steps and stats["fallbacks"] == 0, stats


def test_op_training_ops_opcheck():
    q, k, v = randn(1, 4, 10, 32), randn(1, 2, 12, 32, seed=1), randn(1, 2, 12, 32, seed=2)
    args = (q, k, v, None, True, None, True, randn(4, seed=3), 0, 1.5)
    torch.library.opcheck(torch.ops.mps_ext._scaled_dot_product_attention_training.default, args,
                          test_utils=("test_schema", "test_faketensor"))
    out, stats = torch.ops.mps_ext._scaled_dot_product_attention_training(*args)
    torch.library.opcheck(torch.ops.mps_ext._scaled_dot_product_attention_training_backward.default,
                          (randn(1, 4, 10, 32, seed=4), q, k, v, out, stats, *args[3:]),
                          test_utils=("test_schema", "test_faketensor"))


def test_op_under_torch_compile_runs_the_kernels():
    # mps_ext's op stays whole in the compiled graph (its fake gives the shapes): inductor calls it.
    q, k, v = randn(1, 4, 20, 32), randn(1, 2, 30, 32, seed=1), randn(1, 2, 30, 32, seed=2)
    sinks = randn(4, seed=3)

    def layer(q, k, v):
        return mps_ext.scaled_dot_product_attention(q * 2, k, v, enable_gqa=True, sinks=sinks, window=6).relu()

    compiled = torch.compile(layer, fullgraph=True, dynamic=False)
    compiled(q, k, v)  # compiles
    with mps_ext.trace() as t:
        got = compiled(q, k, v)
    assert t.names == ["attention_prefill_float_d32"], t.names
    assert_close(got, layer(q, k, v))
