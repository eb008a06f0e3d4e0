"""fp8_grouped_mm (Mixture-of-Experts products with e4m3fn expert weights) against torch on the CPU with the
weights dequantized (each expert's rows times its float weight, as torch._grouped_mm computes): decode
pipelines and the tiled kernel, per-expert, per-channel and block scales, odd sizes, empty experts,
errors naming the argument, gradients, checked mode and opcheck."""

import pytest
import torch

import mps_ext
import mps_ext.sim
from mps_ext import fp8
from conftest import on, ran
from tolerances import assert_close_dot

F8 = torch.float8_e4m3fn
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
MT = {torch.float32: "float", torch.float16: "half", torch.bfloat16: "bfloat"}


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def experts(e: int, n: int, k: int, scales: str, seed: int):
    """Quantized random expert weights (E, N, K): (q, scale, block_size, float32 dequantized reference)."""
    w = torch.randn(e, n, k, generator=gen(seed)) * 0.05
    if scales == "channel":
        q, s = fp8.quantize(w, dim=2)
        return q, s.squeeze(2), None, q.float() * s
    if scales == "expert":
        q, s = zip(*(fp8.quantize(m) for m in w))
        s = torch.stack(s)
        return torch.stack(q), s, None, torch.stack(q).float() * s.view(e, 1, 1)
    block = {"block": (128, 128), "block16x48": (16, 48), "block8x40": (8, 40), "block8x36": (8, 36)}[scales]
    q, s = zip(*(fp8.quantize(m, block=block) for m in w))
    full = torch.stack(s).repeat_interleave(block[0], 1).repeat_interleave(block[1], 2)[:, :n, :k]
    return torch.stack(q), torch.stack(s), block, torch.stack(q).float() * full


def reference(x, deq, offs, dtype):
    """Each expert's rows times its dequantized weight (float32; torch._grouped_mm itself refuses rows that are
    not a multiple of 16 bytes), with the terms' magnitudes; rows past offs[-1] dropped."""
    ends = [0, *offs.tolist()]
    pieces = [(x[lo:hi].float() @ w.t(), x[lo:hi].float().abs() @ w.abs().t()) for lo, hi, w in
              zip(ends, ends[1:], deq)]
    return torch.cat([p for p, _ in pieces]).to(dtype), torch.cat([m for _, m in pieces])


# (ends per expert, N, K): the streamed kernel for up to 2 rows per expert on average (x has two rows past
# offs[-1]), the decode kernel for up to 8, else the tiled kernel.
CASES = {
    "stream one row each": ([1, 2, 3, 4], 40, 64),
    "stream empty experts": ([0, 2, 2, 2, 3, 3, 3, 3], 24, 72),
    "stream 16-byte chunks": ([1, 1, 3, 4], 37, 1024),
    "decode_m4 odd sizes": ([4, 4, 9, 12], 33, 97),
    "decode_m8 k=1": ([8, 15, 16], 7, 1),
    "prefill": ([20, 20, 45], 31, 130),
}
BLOCK_K = {"block": 128, "block16x48": 48, "block8x40": 40, "block8x36": 36}


def stream_bytes(k: int) -> int:
    """The bytes of a weight row a lane of the streamed kernel reads per step: 16, or 8 where that leaves fewer
    lanes past K (and K is at most 32 SIMD groups of them)."""
    past = {b: -(-k // (32 * b)) * 32 * b - k for b in (8, 16)}
    return 8 if past[8] < past[16] and -(-k // 256) <= 32 else 16


def kernels(case, scales, dtype, e, n, k, m):
    """What a call of m rows runs: the streamed kernel for up to two rows per expert on average, the decode
    kernel for up to eight, or (more rows per expert, or blocks along K that are not a multiple of a lane's
    bytes) the tiled kernel, its tiles as tall as the average expert's rows."""
    block_k = BLOCK_K.get(scales, k)
    whole = lambda b: block_k >= k or block_k % b == 0  # noqa: E731
    if case != "prefill":
        b = stream_bytes(k)
        if m <= 2 * e and -(-k // (32 * b)) <= 32 and whole(b):
            return [f"fp8_grouped_mm_stream{b}_{MT[dtype]}"]
        if whole(8):
            return [f"fp8_grouped_mm_decode_m{max(2, 1 << (-(-m // min(e, m)) - 1).bit_length())}_{MT[dtype]}"]
    return [f"fp8_grouped_mm_tiled_m{16 if m // e <= 16 else 32}_{MT[dtype]}"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scales", ["expert", "channel", "block", "block16x48", "block8x40", "block8x36"])
@pytest.mark.parametrize("case", list(CASES))
def test_matches_dequantized_grouped_mm(case, scales, dtype, device):
    ends, n, k = CASES[case]
    e = len(ends)
    q, s, block, deq = experts(e, n, k, scales, seed=n + k)
    x = torch.randn(ends[-1] + 2, k, generator=gen(k)).to(dtype)  # two rows past offs[-1], never read
    offs = torch.tensor(ends, dtype=torch.int32)
    with mps_ext.trace() as t:
        got = on(device, mps_ext.fp8_grouped_mm, x, q, s, offs, block_size=block)
    ran(t, device, *kernels(case, scales, dtype, e, n, k, len(x)))
    assert got.shape == (ends[-1] + 2, n) and got.dtype == dtype
    rows = ends[-1]
    want, mag = reference(x, deq, offs, dtype)
    assert_close_dot(got[:rows], want, mag, k)


@pytest.mark.parametrize("scales", ["channel", "block"])
@pytest.mark.parametrize("cores", [1, 32])
def test_decode_takes_a_k_too_long_to_stream(cores, scales):
    # K = 16400 (16-byte aligned rows) is past the streamed kernel's 32 SIMD groups of 512 bytes: the decode
    # kernel takes it, 64 whole steps of 256 bytes and 16 bytes past them. Alone (one core: 2 runs x 32 SIMD
    # groups fill it) each SIMD group streams all of them, fetching a step's bytes before it decodes the step
    # before; on 32 cores four SIMD groups split them, sixteen or seventeen steps each.
    ends, n, k = [1, 2, 2, 4], 64, 16400
    q, s, block, deq = experts(len(ends), n, k, scales, seed=3)
    x, offs = torch.randn(ends[-1], k, generator=gen(4)).to(torch.bfloat16), torch.tensor(ends, dtype=torch.int32)
    with mps_ext.sim.checked(), mps_ext.sim.gpu_cores(cores), mps_ext.trace() as t:
        got = mps_ext.fp8_grouped_mm(x, q, s, offs, block_size=block)
    ran(t, "cpu", "fp8_grouped_mm_decode_m2_bfloat")
    assert t.kernels[0].threadgroup[0] == 128 and t.kernels[0].grid[0] == (8 if cores == 1 else 32), t.kernels
    want, mag = reference(x, deq, offs, torch.bfloat16)
    assert_close_dot(got, want, mag, k)


@pytest.mark.parametrize("cores", [1, 80])
def test_stream_blocks_follow_the_gpu(cores):
    # One token routed to 8 of 128 experts, K = 768 (Qwen3-30B-A3B's down projection): three SIMD groups of
    # 8 bytes per lane, each threadgroup one routed row and a block of weight rows. One core is filled by the
    # largest blocks (32 rows: 8 x 8 threadgroups of 3 SIMD groups); 80 cores (2560 SIMD groups) would take
    # blocks of 4 rows, but a block holds at least 16 KB of weights: 24 rows (11 x 8 threadgroups).
    e, n, k = 128, 256, 768
    q, s, block, deq = experts(e, n, k, "block", seed=5)
    ends = torch.zeros(e, dtype=torch.int32)
    for g in (3, 17, 40, 41, 77, 90, 101, 127):
        ends[g:] += 1
    x = torch.randn(8, k, generator=gen(6)).to(torch.bfloat16)
    with mps_ext.sim.checked(), mps_ext.sim.gpu_cores(cores), mps_ext.trace() as t:
        got = mps_ext.fp8_grouped_mm(x, q, s, ends, block_size=block)
    ran(t, "cpu", "fp8_grouped_mm_stream8_bfloat")
    assert t.kernels[0].threadgroup[0] == 96 and t.kernels[0].grid[:2] == ((8, 8) if cores == 1 else (11, 8)), t.kernels
    want, mag = reference(x, deq, ends, torch.bfloat16)
    assert_close_dot(got, want, mag, k)


@pytest.mark.parametrize("ends", [[1, 3, 4], [20, 40, 45]], ids=["decode", "tiled"])
def test_nan_codes_poison_their_output_column_as_in_torch(ends):
    q, s, _, deq = experts(3, 24, 40, "channel", seed=11)
    q[1, 5, 7] = torch.tensor(float("nan")).to(F8)
    x, offs = torch.randn(ends[-1], 40, generator=gen(12)), torch.tensor(ends, dtype=torch.int32)
    got = mps_ext.fp8_grouped_mm(x, q, s, offs)
    want, _ = reference(x, q.float() * s[..., None], offs, torch.float32)
    assert torch.equal(got.isnan(), want.isnan()) and got.isnan().sum() == ends[1] - ends[0]


def test_uint8_bits_strides_and_empty(device):
    q, s, _, deq = experts(3, 48, 96, "channel", seed=1)
    x = torch.randn(5, 97, generator=gen(2))[:, 1:]  # rows at an odd offset
    offs = torch.tensor([2, 2, 5], dtype=torch.int32)
    want, mag = reference(x, deq, offs, torch.float32)
    wide = torch.zeros(3, 48, 112, dtype=F8)
    wide[..., :96] = q  # expert rows 112 bytes apart
    with mps_ext.trace() as t:
        assert_close_dot(on(device, mps_ext.fp8_grouped_mm, x, q.view(torch.uint8), s.unsqueeze(2), offs), want,
                         mag, 96)
        assert_close_dot(on(device, mps_ext.fp8_grouped_mm, x, wide[..., :96], s, offs), want, mag, 96)
    ran(t, device, "fp8_grouped_mm_stream8_float", "fp8_grouped_mm_stream8_float")
    assert on(device, mps_ext.fp8_grouped_mm, x[:0], q, s, torch.zeros(3, dtype=torch.int32)).shape == (0, 48)
    assert torch.equal(on(device, mps_ext.fp8_grouped_mm, x[:, :0], q[..., :0], s, offs), torch.zeros(5, 48))


def test_argument_errors_name_the_argument():
    q, s, _, _ = experts(3, 16, 32, "channel", seed=3)
    x, offs = torch.randn(4, 32), torch.tensor([1, 2, 4], dtype=torch.int32)
    call = mps_ext.fp8_grouped_mm
    with pytest.raises(TypeError, match="x must be"):
        call(x.double(), q, s, offs)
    with pytest.raises(TypeError, match="weight must be"):
        call(x, q.float(), s, offs)
    with pytest.raises(TypeError, match="weight_scale must be"):
        call(x, q, s.int(), offs)
    with pytest.raises(TypeError, match="offs must be int32"):
        call(x, q, s, offs.long())
    with pytest.raises(TypeError, match="out_dtype must be"):
        call(x, q, s, offs, out_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="x must be 2-D"):
        call(x[None], q, s, offs)
    with pytest.raises(ValueError, match="weight must be 3-D"):
        call(x, q[0], s, offs)
    with pytest.raises(ValueError, match="x's last dimension"):
        call(x[:, :31], q, s, offs)
    with pytest.raises(ValueError, match=r"offs must have shape \(3,\)"):
        call(x, q, s, offs[:2])
    with pytest.raises(ValueError, match=r"weight_scale must have shape \(3,\), \(3, 1, 1\), \(3, 16\)"):
        call(x, q, s[:, :15], offs)
    with pytest.raises(ValueError, match=r"weight_scale must have shape \(3, 1, 1\) for block_size"):
        call(x, q, s, offs, block_size=(128, 128))
    with pytest.raises(ValueError, match="block_size must be"):
        call(x, q, s, offs, block_size=(0, 128))


def test_gradient_of_x_is_the_dequantized_models(device):
    q, s, block, deq = experts(4, 24, 48, "block16x48", seed=4)
    offs = torch.tensor([3, 3, 5, 7], dtype=torch.int32)
    x = torch.randn(8, 48, generator=gen(5), requires_grad=True)
    g = torch.randn(7, 24, generator=gen(6))
    with mps_ext.trace() as t:
        (on(device, mps_ext.fp8_grouped_mm, x, q, s, offs, block_size=block)[:7] * g).sum().backward()
    # The gradient: each expert's weight dequantized, then grouped_mm's kernel on the output's gradient.
    ran(t, device, "fp8_grouped_mm_stream8_float", *["fp8_dequantize_float"] * 4, "grouped_mm_decode_kn_m2_float")
    xr = x.detach().clone().requires_grad_()
    (torch._grouped_mm(xr, deq.transpose(-2, -1), offs=offs)[:7] * g).sum().backward()
    assert_close_dot(x.grad[:7], xr.grad[:7], torch._grouped_mm(g.abs(), deq.abs(), offs=offs), 24)
    assert torch.equal(x.grad[7], torch.zeros(48))  # the row past offs[-1]


def test_checked_mode_on_edge_shapes(device):
    # Rows of x and of the experts not 16-byte aligned (odd K), empty experts, a K of several SIMD groups
    # with block scales along it, for the streamed kernel (8 and 16 bytes per lane) and the decode kernel
    # (split over SIMD groups), and the tiled kernel over partial tiles and blocks (on mps: the same shapes on
    # the GPU).
    with mps_ext.sim.checked():
        for ends, n, k, scales in (([0, 1, 3], 9, 45, "channel"), ([2, 2, 4, 6], 6, 1100, "block16x48"),
                                   ([1, 2, 2], 5, 300, "block16x48"), ([3, 3, 5, 9], 6, 1100, "block16x48"),
                                   ([17, 17, 40], 33, 45, "block8x36")):
            q, s, block, deq = experts(len(ends), n, k, scales, seed=k)
            x = torch.randn(ends[-1], k + 1, generator=gen(7))[:, 1:]
            offs = torch.tensor(ends, dtype=torch.int32)
            want, mag = reference(x, deq, offs, torch.float32)
            with mps_ext.trace() as t:
                got = on(device, mps_ext.fp8_grouped_mm, x, q, s, offs, block_size=block)
            ran(t, device, *kernels("edge", scales, torch.float32, len(ends), n, k, ends[-1]))
            assert_close_dot(got, want, mag, k)


def test_opcheck():
    q, s, block, _ = experts(3, 16, 48, "block16x48", seed=8)
    x = torch.randn(5, 48, generator=gen(9), requires_grad=True)
    offs = torch.tensor([1, 1, 5], dtype=torch.int32)
    torch.library.opcheck(torch.ops.mps_ext.fp8_grouped_mm.default,
                          (x, q.view(torch.uint8), s, offs, list(block), None))
