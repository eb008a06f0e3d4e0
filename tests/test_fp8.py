"""FP8 (e4m3fn): quantize/dequantize,
scaled_mm against torch._scaled_mm on the CPU, fp8_linear against the
dequantized float reference, the aten::_scaled_mm override, the FP8Linear
module and model conversion, checked mode, and opcheck."""

import math
import warnings

import pytest
import torch
import torch.nn.functional as F

import mps_ext
import mps_ext.sim
from mps_ext import fp8
from conftest import on, ran
from tolerances import assert_close_dot

F8 = torch.float8_e4m3fn
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
MT = {torch.float32: "float", torch.float16: "half", torch.bfloat16: "bfloat"}


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype == F8 else t


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def gemv(m: int) -> str:
    """The gemv kernel variant serving m rows (built for 1, 2, 4, 8), for K up to 16384: one row streams the
    rows of w past itself (gemv_stream)."""
    return "gemv_stream" if m == 1 else f"gemv_m{1 << (m - 1).bit_length()}"


# ----------------------------------------------------------- quantize/dequantize

def ref_quantize(x: torch.Tensor, amax: torch.Tensor, expand):
    scale = torch.where(amax == 0, torch.ones_like(amax), amax / 448)
    return (x.float() / expand(scale)).to(F8), scale


def block_amax(x: torch.Tensor, br: int, bc: int) -> torch.Tensor:
    rows, cols = -(-x.shape[0] // br), -(-x.shape[1] // bc)
    return torch.stack([torch.stack([x[i * br:(i + 1) * br, j * bc:(j + 1) * bc].float().abs().amax()
                                     for j in range(cols)]) for i in range(rows)])


def expand_blocks(s: torch.Tensor, shape, br: int, bc: int) -> torch.Tensor:
    return s.repeat_interleave(br, 0).repeat_interleave(bc, 1)[: shape[0], : shape[1]]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", ["tensor", "dim0", "dim1", "dim3d", "block128", "block16x48"])
def test_quantize_and_dequantize_match_torch(mode, dtype, device):
    shape = {"dim3d": (3, 37, 20), "block128": (300, 260)}.get(mode, (50, 70))
    x = (torch.randn(shape, generator=gen(4)) * 5).to(dtype)
    x.view(-1)[7] = 0
    if mode == "dim1":
        x[3] = 0  # an all-zero slice: scale 1
    with mps_ext.trace() as t:
        if mode == "tensor":
            q, s = on(device, fp8.quantize, x)
            want_q, want_s = ref_quantize(x, x.float().abs().amax(), lambda s: s)
        elif mode.startswith("dim"):
            dim = {"dim0": 0, "dim1": 1, "dim3d": 1}[mode]
            q, s = on(device, fp8.quantize, x, dim=dim)
            want_q, want_s = ref_quantize(x, x.float().abs().amax(dim, keepdim=True), lambda s: s)
        else:
            br, bc = (128, 128) if mode == "block128" else (16, 48)
            q, s = on(device, fp8.quantize, x, block=(br, bc))
            want_q, want_s = ref_quantize(x, block_amax(x, br, bc), lambda s: expand_blocks(s, shape, br, bc))
    ran(t, device, f"fp8_amax_{MT[dtype]}", f"fp8_quantize_{MT[dtype]}")
    assert q.dtype == F8 and q.shape == x.shape and s.dtype == torch.float32
    assert torch.equal(s, want_s) and torch.equal(bits(q), bits(want_q))
    block = {"block128": (128, 128), "block16x48": (16, 48)}.get(mode)
    for out_dtype in DTYPES:
        with mps_ext.trace() as t:
            d = on(device, fp8.dequantize, q, s, dtype=out_dtype, block=block)
        ran(t, device, f"fp8_dequantize_{MT[out_dtype]}")
        full = expand_blocks(s, shape, *block) if block else s
        assert torch.equal(d, (q.float() * full).to(out_dtype))
    # uint8 bits work the same, against torch's own conversion of the same bytes
    full = expand_blocks(s, shape, *block) if block else s
    with mps_ext.trace() as t:
        d = on(device, fp8.dequantize, bits(q), s, block=block)
    ran(t, device, "fp8_dequantize_float")
    assert torch.equal(d, bits(q).view(F8).float() * full)


def test_quantize_nan_inf_and_empty(device):
    x = torch.randn(4, 40, generator=gen(5))
    x[1, 3] = math.nan
    x[2, 5] = math.inf
    with mps_ext.trace() as t:
        q, s = on(device, fp8.quantize, x, dim=1)
    ran(t, device, "fp8_amax_float", "fp8_quantize_float")
    assert s[1].isnan().all() and s[2].isinf().all() and not s[[0, 3]].isnan().any()
    want, _ = ref_quantize(x, x.abs().amax(1, keepdim=True), lambda s: s)
    assert torch.equal(bits(q), bits(want))
    q, s = on(device, fp8.quantize, torch.empty(0, 5))
    assert q.shape == (0, 5) and s.shape == ()
    with pytest.raises(ValueError, match="block"):
        fp8.quantize(torch.randn(2, 3, 4), block=(2, 2))
    with pytest.raises(TypeError, match="x must be"):
        fp8.quantize(torch.randn(4, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match="scale must have"):
        fp8.dequantize(q.new_zeros(4, 4), torch.ones(3), block=(2, 2))


def test_quantize_dims_of_size_one_and_argument_checks(device):
    x = torch.randn(5, 1, 7, generator=gen(24))
    for dim in (1, -2):  # one element per slice: the scale has x's shape, and dequantize still inverts
        q, s = on(device, fp8.quantize, x, dim=dim)
        assert s.shape == x.shape
        with mps_ext.trace() as t:
            d = on(device, fp8.dequantize, q, s)
        ran(t, device, "fp8_dequantize_float")
        assert torch.equal(d, q.float() * s)
    for dim in (3, -4):
        with pytest.raises(IndexError, match=rf"fp8.quantize: dim out of range .*\[-3, 2\], but got {dim}\)"):
            fp8.quantize(x, dim=dim)
    q, s = fp8.quantize(torch.randn(300, 140, generator=gen(25)), block=(128, 128))
    assert s.shape == (3, 2)
    for wrong in (s.t().contiguous(), s.reshape(-1)):  # the right count, not the grid
        with pytest.raises(ValueError, match=r"scale must have shape \(3, 2\) for q of shape \[300, 140\]"):
            fp8.dequantize(q, wrong, block=(128, 128))


# ---------------------------------------------------------------- scaled_mm

def fp8_operands(m: int, k: int, n: int, rowwise: bool, seed: int):
    g = gen(seed)
    a = (torch.randn(m, k, generator=g) * 3).to(F8)
    b = (torch.randn(n, k, generator=g) * 3).to(F8).t()  # column-major, as torch wants it
    if rowwise:
        sa, sb = torch.rand(m, 1, generator=g) + 0.5, torch.rand(1, n, generator=g) + 0.5
    else:
        sa, sb = torch.tensor(0.75), torch.tensor(1.25)
    return a, b, sa, sb


def needs_float8(device):
    """Skips where torch keeps no float8 tensors on ``device`` (mps before torch 2.15): no e5m2 operand gets
    there, and mps_ext does not override torch._scaled_mm there."""
    if fp8.storage_dtype(device) != F8:
        pytest.skip("torch keeps no float8 tensors on mps before torch 2.15")


def magnitude(a, b, sa, sb):
    return (a.float().abs() * sa.abs()) @ (b.float().abs() * sb.abs())


SCALED_MM_SHAPES = {1: (64, 48), 2: (200, 33), 4: (130, 300), 8: (256, 40), 9: (72, 130), 64: (200, 70)}


@pytest.mark.parametrize("out_dtype", DTYPES)
@pytest.mark.parametrize("recipe", ["tensor", "row"])
@pytest.mark.parametrize("m", [1, 2, 4, 8, 9, 64])
def test_scaled_mm_matches_torch(m, recipe, out_dtype, device):
    k, n = SCALED_MM_SHAPES[m]
    a, b, sa, sb = fp8_operands(m, k, n, recipe == "row", seed=m * 7 + k)
    bias = torch.randn(n, generator=gen(m)).to(out_dtype) if (m + k) % 2 else None
    with mps_ext.trace() as t:
        got = on(device, mps_ext.scaled_mm, a, b, sa, sb, bias=bias, out_dtype=out_dtype)
    ran(t, device, f"scaled_mm_{gemv(m) if m <= 8 else 'tiled'}_fp8_{MT[out_dtype]}")
    want = torch._scaled_mm(a, b, sa, sb, bias=bias, out_dtype=out_dtype)
    assert got.dtype == want.dtype == out_dtype
    assert_close_dot(got, want, magnitude(a, b, sa, sb), k)


def test_scaled_mm_layouts_bits_and_defaults(device):
    a, b, sa, sb = fp8_operands(5, 96, 40, True, seed=3)
    want = torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)
    mag = magnitude(a, b, sa, sb)
    assert_close_dot(on(device, mps_ext.scaled_mm, a, b, sa, sb), want, mag, 96)  # bfloat16 by default
    assert_close_dot(on(device, mps_ext.scaled_mm, bits(a), bits(b), sa, sb), want, mag, 96)  # uint8 bits
    assert_close_dot(on(device, mps_ext.scaled_mm, a, b.contiguous(), sa, sb), want, mag, 96)  # row-major b
    big = torch.zeros(5, 100, dtype=torch.uint8)
    big[:, 1:97] = bits(a)  # rows at an odd offset: no 16-byte loads
    assert_close_dot(on(device, mps_ext.scaled_mm, big[:, 1:97], b, sa, sb), want, mag, 96)
    a9, b9, sa9, sb9 = fp8_operands(40, 96, 40, False, seed=4)
    assert_close_dot(on(device, mps_ext.scaled_mm, a9[:, :95], b9[:95], sa9, sb9),
                     torch._scaled_mm(a9[:, :95], b9[:95], sa9, sb9, out_dtype=torch.bfloat16),
                     magnitude(a9[:, :95], b9[:95], sa9, sb9), 95)


def test_scaled_mm_nan_and_empty(device):
    a, b, sa, sb = fp8_operands(3, 64, 20, False, seed=5)
    a, b = a.clone(), b.clone()
    bits(a)[1, 7] = 0x7F
    bits(b)[9, 4] = 0xFF
    for m in (3, 40):  # gemv and tiled
        aa = a.repeat(m // 3 + 1, 1)[:m]
        with mps_ext.trace() as t:
            got = on(device, mps_ext.scaled_mm, aa, b, sa, sb, out_dtype=torch.float32)
        ran(t, device, f"scaled_mm_{gemv(m) if m <= 8 else 'tiled'}_fp8_float")
        want = torch._scaled_mm(aa, b, sa, sb, out_dtype=torch.float32)
        assert torch.equal(got.isnan(), want.isnan()) and got.isnan().any()
    assert on(device, mps_ext.scaled_mm, a[:0], b, sa, sb).shape == (0, 20)
    bias = torch.randn(20)
    out = on(device, mps_ext.scaled_mm, a[:, :0], b[:0], sa, sb, bias=bias, out_dtype=torch.float32)
    assert torch.equal(out, bias.expand(3, 20))


@pytest.mark.fallback("shapes cannot be multiplied|bias size|dtypes Float x|fnuz|scaling recipe")
def test_scaled_mm_errors_and_torch_fallbacks():
    a, b, sa, sb = fp8_operands(4, 32, 16, True, seed=6)
    with pytest.raises(ValueError, match="Invalid scaling configuration"):
        mps_ext.scaled_mm(a, b, sa, torch.tensor(1.0))  # row-wise a, tensor-wise b
    with pytest.raises(ValueError, match="Invalid scaling configuration"):
        mps_ext.scaled_mm(a.float(), b, sa, sb)
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):  # torch's own errors
        mps_ext.scaled_mm(a, b[:31], sa, sb)
    with pytest.raises(RuntimeError, match="Bias must be size 16"):
        mps_ext.scaled_mm(a, b, sa, sb, bias=torch.ones(3))
    # Valid calls the kernels do not cover (the fnuz formats) go to torch on the CPU.
    fnuz = b.float().to(torch.float8_e4m3fnuz)
    with mps_ext.trace() as t:
        got = mps_ext.scaled_mm(a, fnuz, sa, sb)
    assert t.kernels == [] and got.dtype == torch.bfloat16
    assert torch.equal(got, torch._scaled_mm(a, fnuz, sa, sb, out_dtype=torch.bfloat16))


FORMATS = {"e4m3fn": F8, "e5m2": torch.float8_e5m2}
ENCODE = {F8: "fp8", torch.float8_e5m2: "e5m2"}


def torch_scaled_mm(*args, **kwargs):
    """torch._scaled_mm as torch defines it on every CPU: on CPUs with AMX its CPU kernel hands
    e4m3fn x e4m3fn to oneDNN, which writes NaN past e4m3fn's range where the definition saturates."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "TF32 acceleration on top of oneDNN")  # flags() sets TF32 too: unrelated
        with torch.backends.mkldnn.flags(enabled=False):
            return torch._scaled_mm(*args, **kwargs)


@pytest.mark.parametrize("out_dtype", [torch.float32, F8, torch.float8_e5m2])
@pytest.mark.parametrize("formats", ["e4m3fn x e4m3fn", "e5m2 x e5m2", "e4m3fn x e5m2", "e5m2 x e4m3fn"])
@pytest.mark.parametrize("m, recipe", [(3, "tensor"), (40, "row")])
def test_scaled_mm_e5m2_and_float8_outputs_are_torchs_bit_for_bit(m, recipe, formats, out_dtype, device):
    needs_float8(device)
    # Small integers and power-of-two scales: every product and sum is exact in float32, in any order, so the
    # float8 outputs (saturation, infinities and roundings after scale_result included) must be torch's exactly.
    k, n = 48, 24
    fa, fb = (FORMATS[f] for f in formats.split(" x "))
    g = gen(m + k)
    a = torch.randint(-6, 7, (m, k), generator=g).float().to(fa)
    b = torch.randint(-6, 7, (n, k), generator=g).float().to(fb).t()
    if recipe == "row":
        sa = 2.0 ** torch.randint(-3, 3, (m, 1), generator=g).float()
        sb = 2.0 ** torch.randint(-3, 3, (1, n), generator=g).float()
    else:
        sa, sb = torch.tensor(0.5), torch.tensor(4.0)
    bias = torch.randint(-50, 50, (n,), generator=g).float()
    bias[:2] = torch.tensor([3000.0, -1e6])  # past e4m3fn's range (saturates), past e5m2's (infinity)
    result = torch.tensor(3.0) if out_dtype != torch.float32 else None
    with mps_ext.trace() as t:
        got = on(device, mps_ext.scaled_mm, a, b, sa, sb, bias=bias, out_dtype=out_dtype, scale_result=result)
    variant = gemv(m) if m <= 8 else "tiled"
    encode = [f"scaled_mm_encode_{ENCODE[out_dtype]}"] if out_dtype != torch.float32 else []
    ran(t, device, f"scaled_mm_{variant}_fp8_float", *encode)
    want = torch_scaled_mm(a, b, sa, sb, bias=bias, out_dtype=out_dtype, scale_result=result)
    assert got.dtype == want.dtype == out_dtype
    if out_dtype == torch.float32:
        assert torch.equal(got, want)
    else:
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
        if out_dtype == F8:
            assert torch.equal(got[:, :2].float(), torch.tensor([448.0, -448.0]).expand(m, 2))
        else:
            assert got[:, 1].float().isneginf().all()


def test_torchs_opinfo_samples_for_scaled_mm_run_the_kernels(device):
    needs_float8(device)
    from torch.testing._internal.common_methods_invocations import op_db

    info = next(op for op in op_db if op.name == "torch._scaled_mm")
    samples = list(info.sample_inputs("cpu", F8))
    assert {(s.input.dtype, s.args[0].dtype) for s in samples} == {(F8, F8), (F8, torch.float8_e5m2),
                                                                   (torch.float8_e5m2, F8)}
    for s in samples:
        want = torch_scaled_mm(s.input, *s.args, **s.kwargs)
        with mps_ext.overrides.enabled(device), mps_ext.trace() as t:
            got = on(device, torch._scaled_mm, s.input, *s.args, **s.kwargs)
        ran(t, device, "scaled_mm_tiled_fp8_float", f"scaled_mm_encode_{ENCODE[s.input.dtype]}")
        assert got.dtype == want.dtype == s.input.dtype  # torch's default: the output in a's format
        # One unit in the last place: the float results differ in summation order before rounding to float8.
        ulp, tiny = (2.0**-3, 2.0**-9) if got.dtype == F8 else (2.0**-2, 2.0**-16)
        torch.testing.assert_close(got.float(), want.float(), rtol=ulp, atol=tiny, equal_nan=True)


class TestScaledMmOverride:
    @pytest.mark.fallback("scaling recipe")
    def test_torch_scaled_mm_runs_the_kernels(self, device):
        needs_float8(device)
        a, b, sa, sb = fp8_operands(8, 128, 64, True, seed=7)
        want = torch._scaled_mm(a, b, sa, sb, out_dtype=torch.float16)
        mps_ext.overrides.reset_stats()
        with mps_ext.overrides.enabled(device), mps_ext.trace() as t:
            got = on(device, torch._scaled_mm, a, b, sa, sb, out_dtype=torch.float16)
            with pytest.raises(ValueError, match="Invalid scaling configuration"):
                on(device, torch._scaled_mm, a, b, sa, torch.tensor(1.0), out_dtype=torch.float32)
        ran(t, device, "scaled_mm_gemv_m8_fp8_half")
        assert_close_dot(got, want, magnitude(a, b, sa, sb), 128)
        s = mps_ext.overrides.stats()["aten::_scaled_mm"]
        assert s["hits"] == 1 and s["fallbacks"] == 1

    @pytest.mark.fallback("fnuz")
    def test_fnuz_formats_go_to_torch(self):  # only torch's CPU kernel has them
        a, b, sa, sb = fp8_operands(8, 128, 64, True, seed=7)
        fnuz = a.float().to(torch.float8_e5m2fnuz)
        mps_ext.overrides.reset_stats()
        with mps_ext.overrides.enabled("cpu"), mps_ext.trace() as t:
            with_fnuz = torch._scaled_mm(fnuz, b, sa, sb, out_dtype=torch.float32)
        assert t.kernels == []
        assert torch.equal(with_fnuz, torch._scaled_mm(fnuz, b, sa, sb, out_dtype=torch.float32))
        s = mps_ext.overrides.stats()["aten::_scaled_mm"]
        assert s["reasons"] == {"dtypes Float8_e5m2fnuz x Float8_e4m3fn (the fnuz formats are not implemented)": 1}

    @pytest.mark.fallback("bias dtype differs")
    def test_f_scaled_mm_runs_the_kernels(self, device):
        needs_float8(device)
        st = F.ScalingType
        mps_ext.overrides.reset_stats()
        for recipe, m in ((st.TensorWise, 3), (st.RowWise, 40)):
            a, b, sa, sb = fp8_operands(m, 96, 48, recipe == st.RowWise, seed=m)
            bias = torch.randn(48).bfloat16()
            want = F.scaled_mm(a, b, sa, recipe, sb, recipe, bias=bias)
            with mps_ext.overrides.enabled(device), mps_ext.trace() as t:
                got = on(device, F.scaled_mm, a, b, sa, recipe, sb, recipe, bias=bias)
                f32_bias = on(device, F.scaled_mm, a, b, sa, recipe, sb, recipe, bias=bias.float())  # torch decides
            ran(t, device, f"scaled_mm_{gemv(m) if m <= 8 else 'tiled'}_fp8_bfloat")
            assert_close_dot(got, want, magnitude(a, b, sa, sb), 96)
            assert f32_bias.dtype == torch.bfloat16
        s = mps_ext.overrides.stats()["aten::_scaled_mm_v2"]
        assert s["hits"] == 2 and s["reasons"] == {"bias dtype differs from the output's": 2}

    def test_disabled_is_torch(self):
        a, b, sa, sb = fp8_operands(2, 32, 16, False, seed=8)
        with mps_ext.trace() as t:
            torch._scaled_mm(a, b, sa, sb, out_dtype=torch.float32)
        assert t.kernels == []


# --------------------------------------------------------------- fp8_linear

def weight_and_scale(n: int, k: int, granularity: str, seed: int):
    w = torch.randn(n, k, generator=gen(seed)) * 0.05
    if granularity == "tensor":
        q, s = fp8.quantize(w)
        return q, s, None, q.float() * s
    if granularity == "channel":
        q, s = fp8.quantize(w, dim=1)
        return q, s.view(-1), None, q.float() * s
    block = {"block": (128, 128), "block16x48": (16, 48), "block8x40": (8, 40)}[granularity]
    q, s = fp8.quantize(w, block=block)
    return q, s, block, q.float() * expand_blocks(s, (n, k), *block)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("granularity", ["tensor", "channel", "block", "block16x48", "block8x40"])
@pytest.mark.parametrize("lead", [(1,), (2, 3), (8,), (9,), (2, 20)])
def test_fp8_linear_matches_the_dequantized_reference(lead, granularity, dtype, device):
    n, k = (300, 260) if granularity == "block" else (70, 200)
    q, s, block, deq = weight_and_scale(n, k, granularity, seed=len(lead) + n)
    x = torch.randn(*lead, k, generator=gen(9)).to(dtype)
    bias = torch.randn(n, generator=gen(10)).to(dtype) if lead[-1] % 2 == 0 else None
    with mps_ext.trace() as t:
        got = on(device, mps_ext.fp8_linear, x, q, s, bias, block_size=block)
    rows = math.prod(lead)
    few = rows <= 8 and granularity != "block8x40"  # block_k % 16 != 0: tiled, which scales per element
    ran(t, device, f"fp8_linear_{gemv(rows) if few else 'tiled'}_{MT[dtype]}")
    want = F.linear(x.float(), deq, bias.float() if bias is not None else None).to(dtype)
    assert got.shape == (*lead, n) and got.dtype == dtype
    assert_close_dot(got, want, x.float().abs() @ deq.abs().t(), k)


@pytest.mark.parametrize("rows", [1, 8])
def test_fp8_linear_decodes_every_code_exactly(rows, device):
    # The GEMV decodes 16 bytes per lane through halves (subnormal codes through half subnormals) unless they
    # hold a NaN code, then through floats:
    # one-hot rows of x pick single weights, so each output is one decoded code, exact in float32.
    codes = torch.arange(256, dtype=torch.uint8)
    codes[codes.view(F8).float().isnan()] = 0  # a NaN code poisons its whole dot product (tested elsewhere)
    w = torch.stack([codes, codes.flip(0), *(codes[torch.randperm(256, generator=gen(r))] for r in range(30))])
    picks = torch.tensor([0, 5, 17, 40, 100, 128, 200, 255])[:rows]
    x = torch.zeros(rows, 256)
    x[torch.arange(rows), picks] = 1
    with mps_ext.trace() as t:
        got = on(device, mps_ext.fp8_linear, x, w.view(F8), torch.ones(()))
    ran(t, device, f"fp8_linear_{gemv(rows)}_float")
    assert torch.equal(got, w.view(F8).float()[:, picks].t())


@pytest.mark.parametrize("granularity", ["channel", "block"])
@pytest.mark.parametrize("rows", [1, 2, 4, 8])
def test_fp8_linear_nan_codes_poison_their_rows_as_in_torch(rows, granularity, device):
    # The kernels decode 16 bytes through halves unless they hold a NaN code (0x7F, 0xFF), then through
    # floats, which give NaN its NaN: in torch, a NaN in a row of the dequantized w makes every dot product
    # with it NaN.
    # Codes at the first and last byte of a row and inside one; aligned rows, so whole steps stream.
    n, k = 40, 1024
    q, s, block, deq = weight_and_scale(n, k, granularity, seed=rows)
    codes = bits(q)
    codes[5, 100], codes[17, k - 1], codes[30, 0] = 0x7F, 0xFF, 0x7F
    deq = deq.clone()
    deq[[5, 17, 30], [100, k - 1, 0]] = math.nan
    x = torch.randn(rows, k, generator=gen(rows)).to(torch.bfloat16)
    with mps_ext.trace() as t:
        got = on(device, mps_ext.fp8_linear, x, q, s, block_size=block)
    ran(t, device, f"fp8_linear_{gemv(rows)}_bfloat")
    want = F.linear(x.float(), deq)
    assert torch.equal(got.isnan(), want.isnan()) and got.isnan().sum() == 3 * rows


@pytest.mark.parametrize("k", [4096, 4100])
@pytest.mark.parametrize("granularity", ["tensor", "block"])
@pytest.mark.parametrize("rows", [2, 3])
def test_fp8_linear_splits_a_long_k(rows, granularity, k, device):
    # A router's shape: 64 rows of w leave the simulator's 1024 SIMD groups idle, so SIMD groups split K
    # (32 x 16 bytes per step, at least two steps each) and add their sums through threadgroup memory.
    # K = 4096: 16-byte aligned rows, whole steps without bounds tests; K = 4100: every step's loads checked.
    n = 64
    q, s, block, deq = weight_and_scale(n, k, granularity, seed=rows)
    x = torch.randn(rows, k, generator=gen(11)).to(torch.bfloat16)
    with mps_ext.trace() as t:
        got = on(device, mps_ext.fp8_linear, x, q, s, block_size=block)
    ran(t, device, f"fp8_linear_{gemv(rows)}_bfloat")
    if device == "cpu":
        per_simdgroup = 1 if rows == 1 else 4 if rows == 2 else 2  # rows of w: fp8_rows_per_simdgroup
        assert t.kernels[0].grid[0] == n // per_simdgroup and t.kernels[0].threadgroup[0] > 32
    want = F.linear(x.float(), deq).to(torch.bfloat16)
    assert_close_dot(got, want, x.float().abs() @ deq.abs().t(), k)


@pytest.mark.parametrize("granularity", ["tensor", "block"])
def test_fp8_linear_streams_a_long_k_alone(granularity):
    # K = 16400 is past what one row of x can hold in a threadgroup's registers (32 SIMD groups of 512 bytes),
    # so one SIMD group per row of w: on one core the 64 rows fill the GPU, so no SIMD group splits K with
    # another; each streams sixteen whole steps of 1024 bytes, fetching a step's bytes before it decodes the
    # step before, the last one with the 16 bytes past them (rows 16-byte aligned, so no bounds test inside
    # the whole steps; checked mode proves that no load strays past a row).
    n, k = 64, 16400
    q, s, block, deq = weight_and_scale(n, k, granularity, seed=7)
    x = torch.randn(1, k, generator=gen(13)).to(torch.bfloat16)
    with mps_ext.sim.checked(), mps_ext.sim.gpu_cores(1), mps_ext.trace() as t:
        got = mps_ext.fp8_linear(x, q, s, block_size=block)
    ran(t, "cpu", "fp8_linear_gemv_m1_bfloat")
    assert t.kernels[0].grid[0] * t.kernels[0].threadgroup[0] == 32 * n, t.kernels  # a SIMD group per row
    want = F.linear(x.float(), deq).to(torch.bfloat16)
    assert_close_dot(got, want, x.float().abs() @ deq.abs().t(), k)


STREAM_CASES = {  # (n, k, granularity, w's rows at a 16-byte offset): what each shows
    "whole": (200, 4096, "channel", True),  # 8 SIMD groups of 512 bytes, no bounds test
    "tail": (37, 4100, "tensor", True),  # a ninth SIMD group with 4 bytes; rows past n in the last batch
    "longest": (20, 16384, "channel", True),  # 32 SIMD groups: the most a threadgroup holds
    "blocks": (300, 1024, "block", True),  # scales change along K: each 16-byte chunk scaled
    "blocks16x48": (45, 528, "block16x48", True),
    "short": (9, 40, "channel", True),  # one SIMD group, most lanes past K
    "unaligned": (33, 1000, "channel", False),  # every load tested (w's rows from byte 1, x from element 1)
}


@pytest.mark.parametrize("case", STREAM_CASES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_fp8_linear_one_row_streams_w_past_it(case, dtype):
    # One row of x: each SIMD group of a threadgroup holds its 512 bytes' worth of x in registers and the
    # threadgroup's rows of w stream past (an even number of them, 32 at most); the SIMD groups' partial sums
    # meet in threadgroup memory. Checked mode proves that no load strays past K or past a row.
    n, k, granularity, aligned = STREAM_CASES[case]
    q, s, block, deq = weight_and_scale(n, k, granularity, seed=n + k)
    if not aligned:
        q = torch.cat([q.view(torch.uint8).new_zeros(n, 1), q.view(torch.uint8)], 1)[:, 1:].view(F8)
    x = torch.randn(1, k + 1, generator=gen(k)).to(dtype)[:, 1:] if not aligned else \
        torch.randn(1, k, generator=gen(k)).to(dtype)
    bias = torch.randn(n, generator=gen(n)).to(dtype)
    with mps_ext.sim.checked(), mps_ext.trace() as t:
        got = mps_ext.fp8_linear(x, q, s, bias, block_size=block)
    ran(t, "cpu", f"fp8_linear_gemv_stream_{MT[dtype]}")
    (groups, _, _), (threads, _, _) = t.kernels[0].grid, t.kernels[0].threadgroup
    assert threads == 32 * -(-k // 512)
    assert any(-(-n // rows) == groups for rows in range(2, 33, 2)), t.kernels  # an even number of rows each
    want = F.linear(x.float(), deq, bias.float()).to(dtype)
    assert_close_dot(got, want, x.float().abs() @ deq.abs().t() + bias.float().abs(), k)


@pytest.mark.parametrize("e5m2", [False, True])
def test_scaled_mm_one_row_streams(e5m2):
    # scaled_mm with one row of a: a's e4m3fn (or e5m2) bytes decoded once into registers, b's rows streamed.
    a, b, sa, sb = fp8_operands(1, 1000, 70, True, seed=3)
    if e5m2:
        a, b = a.float().to(torch.float8_e5m2), b.float().to(torch.float8_e5m2)
    with mps_ext.sim.checked(), mps_ext.trace() as t:
        got = mps_ext.scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)
    ran(t, "cpu", "scaled_mm_gemv_stream_fp8_bfloat")
    want = torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)
    assert_close_dot(got, want, magnitude(a, b, sa, sb), 1000)


def test_fp8_linear_bits_strides_and_errors(device):
    q, s, _, deq = weight_and_scale(48, 96, "channel", seed=11)
    x = torch.randn(3, 97, generator=gen(12))[:, 1:]  # rows at an odd offset
    want = F.linear(x, deq)
    mag = x.abs() @ deq.abs().t()
    with mps_ext.trace() as t:
        assert_close_dot(on(device, mps_ext.fp8_linear, x, bits(q), s.view(48, 1)), want, mag, 96)
        assert_close_dot(on(device, mps_ext.fp8_linear, x, q, s), want, mag, 96)
    ran(t, device, "fp8_linear_gemv_m4_float", "fp8_linear_gemv_m4_float")
    assert on(device, mps_ext.fp8_linear, torch.randn(0, 96), q, s).shape == (0, 48)
    bias = torch.randn(5)
    assert torch.equal(on(device, mps_ext.fp8_linear, torch.randn(2, 0), q.new_zeros(5, 0), torch.tensor(1.0), bias),
                       bias.expand(2, 5))
    with pytest.raises(TypeError, match="input must be"):
        mps_ext.fp8_linear(x.double(), q, s)
    with pytest.raises(TypeError, match="weight must be"):
        mps_ext.fp8_linear(x, q.float(), s)
    with pytest.raises(RuntimeError, match="last dimension"):
        mps_ext.fp8_linear(x[:, :95], q, s)
    with pytest.raises(ValueError, match="weight_scale must have shape"):
        mps_ext.fp8_linear(x, q, torch.ones(47))
    with pytest.raises(ValueError, match=r"weight_scale must have shape \(1, 1\)"):
        mps_ext.fp8_linear(x, q, torch.ones(2, 2), block_size=(128, 128))
    with pytest.raises(ValueError, match="bias must have shape"):
        mps_ext.fp8_linear(x, q, s, torch.ones(3))


def test_fp8_linear_gradients(device):
    q, s, block, deq = weight_and_scale(40, 64, "block16x48", seed=21)
    x = torch.randn(2, 5, 64, generator=gen(22), requires_grad=True)
    bias = torch.randn(40, requires_grad=True)
    w = torch.randn(2, 5, 40, generator=gen(23))

    def loss(x, bias, q, s, w):
        return (mps_ext.fp8_linear(x, q, s, bias, block_size=block) * w).sum()

    with mps_ext.trace() as t:
        on(device, loss, x, bias, q, s, w).backward()  # x and bias moved by a differentiable copy
    ran(t, device, "fp8_linear_tiled_float", "fp8_dequantize_float")  # the input's gradient: dequantized weight
    xr, br = x.detach().clone().requires_grad_(), bias.detach().clone().requires_grad_()
    (F.linear(xr, deq, br) * w).sum().backward()
    assert_close_dot(x.grad, xr.grad, w.abs() @ deq.abs(), 40)
    assert_close_dot(bias.grad, br.grad, w.abs().sum((0, 1)), 10)


# ---------------------------------------------------------- modules, convert

def test_fp8_linear_module_granularities(device):
    lin = torch.nn.Linear(200, 72)
    x = torch.randn(5, 200, generator=gen(13))
    for granularity in ("channel", "tensor", "block"):
        layer = mps_ext.nn.FP8Linear.from_linear(lin, granularity=granularity, block_size=(32, 64))
        assert layer.weight.dtype == torch.uint8 and layer.weight_scale_inv.dtype == torch.float32
        block = layer.block_size
        s = layer.weight_scale_inv
        deq = layer.weight.view(F8).float() * (expand_blocks(s, (72, 200), *block) if block else s)
        with mps_ext.trace() as t:
            got = on(device, layer.to(device), x)
        ran(t, device, "fp8_linear_gemv_m8_float")
        assert_close_dot(got, F.linear(x, deq, lin.bias), x.abs() @ deq.abs().t(), 200)
        # FP8 error against the float layer: e4m3 keeps 3 mantissa bits.
        want = lin(x)
        assert ((got - want).norm() / want.norm()).item() < 0.05
    with pytest.raises(ValueError, match="granularity"):
        mps_ext.nn.FP8Linear.from_linear(lin, granularity="row")


def test_convert_a_small_mlp(device):
    torch.manual_seed(14)
    mlp = torch.nn.Sequential(torch.nn.Linear(96, 160), torch.nn.GELU(), torch.nn.Linear(160, 40))
    x = torch.randn(4, 96)
    want = mlp(x)
    with torch.no_grad():
        mps_ext.fp8.convert(mlp).to(device)
        with mps_ext.trace() as t:
            got = on(device, mlp, x)
    assert isinstance(mlp[0], mps_ext.nn.FP8Linear) and isinstance(mlp[2], mps_ext.nn.FP8Linear)
    ran(t, device, "fp8_linear_gemv_m4_float", "fp8_linear_gemv_m4_float")
    # The kernels against torch on the dequantized weights, layer by layer...
    h = x
    for layer in mlp:
        if isinstance(layer, mps_ext.nn.FP8Linear):
            deq = layer.weight.cpu().view(F8).float() * layer.weight_scale_inv.cpu().reshape(-1, 1)
            with mps_ext.trace() as t:
                got_layer = on(device, layer, h)
            ran(t, device, "fp8_linear_gemv_m4_float")
            bias = layer.bias.cpu()
            assert_close_dot(got_layer, F.linear(h, deq, bias), h.abs() @ deq.abs().t(), layer.in_features)
            h = got_layer
        else:
            h = layer(h)
    # ...and the FP8 model against the float one: e4m3 keeps 3 mantissa bits.
    assert ((got - want).norm() / want.norm()).item() < 0.05
    # A float8 checkpoint loads into the uint8 buffer bit for bit.
    q, s = fp8.quantize(torch.randn(300, 260, generator=gen(15)), block=(128, 128))
    fresh = mps_ext.nn.FP8Linear(260, 300, block_size=(128, 128))
    fresh.load_state_dict({"weight": q, "weight_scale_inv": s, "bias": torch.randn(300)})
    assert torch.equal(fresh.weight, bits(q))


# ------------------------------------------------------- checked mode, opcheck

def test_checked_mode_on_edge_shapes(device):
    # Every kernel runs checked in tests/test_checked_kernels.py; here block tails, both scaling recipes,
    # float8 outputs and rows that start unaligned (on mps: the same shapes on the GPU).
    with mps_ext.sim.checked():
        x = torch.randn(40, 72, generator=gen(17)).to(torch.bfloat16)
        q, s = on(device, fp8.quantize, x, block=(16, 32))
        deq = on(device, fp8.dequantize, q, s, dtype=torch.half, block=(16, 32))
        want_deq = (q.view(F8).float() * expand_blocks(s, (40, 72), 16, 32)).half()
        assert torch.equal(deq, want_deq)
        for m, recipe in ((3, False), (33, True)):
            a, b, sa, sb = fp8_operands(m, 72, 40, recipe, seed=m)
            assert_close_dot(on(device, mps_ext.scaled_mm, a, b, sa, sb, out_dtype=torch.float32),
                             torch._scaled_mm(a, b, sa, sb, out_dtype=torch.float32), magnitude(a, b, sa, sb), 72)
            if fp8.storage_dtype(device) == F8:  # e5m2 reaches mps from torch 2.15 on
                e5m2 = a.float().to(torch.float8_e5m2)
                torch.testing.assert_close(
                    on(device, mps_ext.scaled_mm, e5m2, b, sa, sb, out_dtype=torch.float8_e5m2).float(),
                    torch_scaled_mm(e5m2, b, sa, sb, out_dtype=torch.float8_e5m2).float(),
                    rtol=2.0**-2, atol=0)  # one e5m2 unit: the sums' order differs
        w = q.view(F8).float() * expand_blocks(s, (40, 72), 16, 32)
        bias = torch.randn(40, generator=gen(19))
        for rows in (2, 35):
            xs = torch.randn(rows, 72, generator=gen(18))
            assert_close_dot(on(device, mps_ext.fp8_linear, xs, q, s, bias, block_size=(16, 32)),
                             F.linear(xs, w, bias), xs.abs() @ w.abs().t() + bias.abs(), 72)
            w_half = q[:, 1:71].view(F8).float() * 0.5
            assert_close_dot(on(device, mps_ext.fp8_linear, xs[:, 1:71], q[:, 1:71], torch.tensor(0.5)),  # unaligned
                             F.linear(xs[:, 1:71], w_half), xs[:, 1:71].abs() @ w_half.abs().t(), 70)


@pytest.mark.parametrize("op", ["fp8_quantize", "fp8_dequantize", "scaled_mm", "fp8_linear"])
def test_opcheck(op):
    # e4m3fn operands as uint8 bits: opcheck's schema test compares inputs
    # with arithmetic torch does not implement for float8.
    x = torch.randn(20, 48, generator=gen(19))
    q, s = fp8.quantize(x, block=(16, 16))
    q = bits(q)
    a, b, sa, sb = (bits(t) for t in fp8_operands(4, 48, 24, True, seed=20))
    args = {
        "fp8_quantize": (x, 16, 16),
        "fp8_dequantize": (q, s, 16, 16, torch.bfloat16),
        "scaled_mm": (a, b, sa, sb, torch.randn(24), torch.float16),
        "fp8_linear": (torch.randn(3, 48, requires_grad=True), q, s, None, [16, 16]),
    }[op]
    torch.library.opcheck(getattr(torch.ops.mps_ext, op).default, args)
