"""Interpolation (F.interpolate's nearest, nearest-exact, linear, bilinear, trilinear and bicubic modes:
upsample_nearest{1,2,3}d, _upsample_nearest_exact{1,2,3}d, upsample_linear1d, upsample_bilinear2d,
upsample_trilinear3d, upsample_bicubic2d and their backward) with the overrides on, against torch's CPU kernels:
nearest bit for bit in every dtype torch's CPU kernels take, linear and cubic within a dot product's rounding, in
torch's layout, over align_corners, the scale forms (sizes, integer, fractional and downsampling scales, scales that
disagree with the sizes), views, empty inputs, NaN and inf; backward against float64 and the same bits every run;
forward-mode AD; torch's errors for what torch rejects; opcheck and the meta kernels' shapes and strides; the 2x
nearest-exact upsampling of diffusers' VAE decoders."""

import contextlib
import math
import random
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_utils import CrossRefFakeMode
from torch.autograd import forward_ad

import mps_ext
from conftest import backend, on, to_device
from tolerances import assert_close, assert_close_dot, reduction_scale

aten = torch.ops.aten
TYPE = {torch.float32: "float", torch.float16: "half", torch.bfloat16: "bfloat"}
BYTES = {1: "uchar", 2: "ushort", 4: "uint"}
FLOATS = [torch.float32, torch.float16, torch.bfloat16]


@dataclass(frozen=True)
class Op:
    mode: str  # F.interpolate's
    dims: int  # interpolated (trailing) dimensions

    @property
    def name(self):
        return {"nearest": f"upsample_nearest{self.dims}d", "nearest-exact": f"_upsample_nearest_exact{self.dims}d",
                "linear": "upsample_linear1d", "bilinear": "upsample_bilinear2d",
                "trilinear": "upsample_trilinear3d", "bicubic": "upsample_bicubic2d"}[self.mode]

    @property
    def family(self):
        return {"nearest": "nearest", "nearest-exact": "nearest_exact", "bicubic": "cubic"}.get(self.mode, "linear")

    @property
    def nearest(self):
        return self.family.startswith("nearest")

    def __str__(self):
        return self.name

    def __call__(self, x, size, scales, align_corners=False):
        """The aten op itself: the scales as given (None where the call has none)."""
        scales = scales or [None] * self.dims
        flag = () if self.nearest else (align_corners,)
        return getattr(aten, self.name)(x, list(size), *flag, *scales)

    def backward(self, g, size, input_size, scales, align_corners=False):
        scales = scales or [None] * self.dims
        flag = () if self.nearest else (align_corners,)
        return getattr(aten, self.name + "_backward")(g, list(size), list(input_size), *flag, *scales)

    def forward_kernel(self, dtype):
        element = BYTES[torch.empty(0, dtype=dtype).element_size()] if self.nearest else TYPE[dtype]
        return f"upsample_{self.family}_{element}_{self.dims}d"

    def repeat_kernel(self, dtype, pairs):
        """Nearest's kernel where each element is copied 2^k times along every dimension (channels first: `pairs`
        where rows double)."""
        element = BYTES[torch.empty(0, dtype=dtype).element_size()]
        return f"upsample_repeat{'_pairs' if pairs else ''}_{element}_{self.dims}d"

    def forward_kernels(self, dtype):
        """The kernels a forward may run (test_nearest_repeats_... says which one where)."""
        if not self.nearest:
            return {self.forward_kernel(dtype)}
        return {self.forward_kernel(dtype), self.repeat_kernel(dtype, False), self.repeat_kernel(dtype, True)}

    def backward_kernel(self, dtype):
        return f"upsample_backward_{self.family}_{TYPE[dtype]}_{self.dims}d"


OPS = [Op("nearest", 1), Op("nearest", 2), Op("nearest", 3), Op("nearest-exact", 1), Op("nearest-exact", 2),
       Op("nearest-exact", 3), Op("linear", 1), Op("bilinear", 2), Op("trilinear", 3), Op("bicubic", 2)]
# Odd sizes; the batch and channels too.
SHAPES = {1: (2, 3, 7), 2: (2, 3, 5, 7), 3: (1, 3, 3, 5, 4)}
# torch's CPU nearest kernels take uint8 as well; float64 is tested with the fallbacks.
NEAREST_TYPES = [torch.uint8, *FLOATS]


def values(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.uint8:
        return torch.randint(0, 256, shape, generator=g, dtype=torch.uint8)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * 4).to(dtype)


def form(name, sizes):
    """(output size, scales) of a call as F.interpolate makes it from the input's spatial `sizes`: a size alone
    (scales None), or a scale factor with the output size floor(size * scale) and the scales passed on."""
    if name == "sizes":
        return [2 * n + 1 if i % 2 == 0 else max(n - 2, 1) for i, n in enumerate(sizes)], None
    scales = {"integer scale": [2.0, 3.0, 2.0], "fractional scale": [1.7, 2.5, 1.3], "downsampling": [0.6, 0.5, 0.8],
              "mixed": [3.0, 0.75, 1.25]}[name][:len(sizes)]
    return [max(math.floor(n * s), 1) for n, s in zip(sizes, scales)], scales


FORMS = ["sizes", "integer scale", "fractional scale", "downsampling", "mixed"]


def bits(t):
    return t.contiguous().view(torch.uint8)


def assert_same(got, want):
    """Same shape, strides, dtype and bytes (NaNs included)."""
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
    if got.numel():
        assert got.stride() == want.stride(), (got.stride(), want.stride())
    assert torch.equal(bits(got), bits(want))


def weights(op, n_in, n_out, scale, align_corners):
    """torch's weights along one dimension, n_out x n_in: row o, how much output o reads of each input index. Linear
    and cubic: torch's forward of one-hot inputs (bicubic's other dimension unchanged, which it reads with the
    weights 0, 1, 0, 0 of one index); nearest: its backward of one-hot gradients, since the nearest backward indexes
    with nearest_idx whatever the layout, and so do these weights."""
    if op.nearest:
        eye = torch.eye(n_out).view(n_out, 1, n_out)
        return Op(op.mode, 1).backward(eye, [n_out], [n_out, 1, n_in], [scale]).reshape(n_out, n_in).double()
    eye = torch.eye(n_in)
    if op.family == "cubic":
        w = aten.upsample_bicubic2d(eye.view(n_in, 1, 1, n_in), [1, n_out], align_corners, None, scale)
    else:
        w = aten.upsample_linear1d(eye.view(n_in, 1, n_in), [n_out], align_corners, scale)
    return w.reshape(n_in, n_out).T.double()


def through(t, matrices):
    """t (N, C, *spatial) in float64 with spatial dimension k multiplied by matrices[k] (new index x old)."""
    t = t.double()
    for k, m in enumerate(matrices):
        t = (t.movedim(2 + k, -1) @ m.T).movedim(-1, 2 + k)
    return t


def matrices(op, in_sizes, out_sizes, scales, align_corners):
    scales = scales or [None] * op.dims
    return [weights(op, i, o, s, align_corners) for i, o, s in zip(in_sizes, out_sizes, scales)]


# Cubic weights are polynomials in the distance t whose terms reach 3 (4 |A|): torch's CPU kernels round them fused
# where their compiler contracts the multiply-adds (its x86-64 and arm64 builds differ), the kernels as torch's
# source writes them. Over 1-19 inputs to 1-39 outputs, four scale forms and align_corners, the two differed by up to
# 24 units of 2^-24: each weight may differ by 2^-19, which is 4 x 2^-24 x 2 sqrt(16) (assert_close_dot's bound for a
# magnitude of 4 over 16 terms).
CUBIC_WEIGHT_ERROR = 4.0


def magnitude(op, t, ws):
    """What assert_close_dot bounds the rounding of through(t, ws) by: the sum of the terms' |weight * t|, and for
    cubic each dimension's weight error, propagated through the other dimensions' weights."""
    mag = through(t.abs(), [w.abs() for w in ws])
    if op.family == "cubic":
        for k in range(len(ws)):
            support = [(w != 0).double() if j == k else w.abs() for j, w in enumerate(ws)]
            mag += CUBIC_WEIGHT_ERROR * through(t.abs(), support)
    return mag


def terms(op, ws, backward=False):
    """The most terms an element's sum has: an output's taps, or (backward) for an input index, the outputs
    reading it times their taps, which may all land on it where they are clamped into the input."""
    taps = {"nearest": 1, "nearest_exact": 1, "linear": 2, "cubic": 4}[op.family]
    if not backward:
        return taps ** len(ws)
    return math.prod(max(int((w != 0).sum(0).max()), 1) * taps for w in ws)


def run_on(device, fn, *args):
    """fn on `device` with the overrides on; its result on the CPU and the kernels it ran (all on the device's
    backend)."""
    with mps_ext.overrides.enabled(device), mps_ext.trace() as t:
        out = on(device, fn, *args)
    assert all(k.backend == backend(device) for k in t.kernels), t.names
    return out, t.names


def check_forward(device, op, x, size, scales, align_corners=False):
    """The op with the overrides on is torch's (nearest bit for bit, linear and cubic within the rounding of their
    sums), in torch's layout, and ran exactly the op's kernel."""
    got, names = run_on(device, lambda v: op(v, size, scales, align_corners), x)
    if op.nearest:
        want = op(x, size, scales)
        assert_same(got, want)
    else:
        # torch's float32 result, rounded once to half or bfloat16 as the kernels round theirs.
        want = op(x.float(), size, scales, align_corners)
        layout = op(x, size, scales, align_corners)
        assert got.shape == layout.shape and (got.stride() == layout.stride() or not got.numel())
        ws = matrices(op, x.shape[2:], size, scales, align_corners)
        assert_close_dot(got, want.to(x.dtype), magnitude(op, x.nan_to_num(), ws), terms(op, ws))
    if want.numel():
        assert len(names) == 1 and names[0] in op.forward_kernels(x.dtype), names
    return got


@pytest.mark.parametrize("op", OPS, ids=str)
@pytest.mark.parametrize("dtype", NEAREST_TYPES, ids=str)
def test_forward(device, op, dtype):
    if dtype not in FLOATS and not op.nearest:
        pytest.skip("linear and cubic kernels take float32, float16 and bfloat16")
    shape = SHAPES[op.dims]
    for i, name in enumerate(FORMS):
        size, scales = form(name, shape[2:])
        for align_corners in (False,) if op.nearest else (False, True):
            check_forward(device, op, values(shape, dtype, seed=i), size, scales, align_corners)


@pytest.mark.parametrize("op", OPS, ids=str)
def test_interpolate_and_upsample_modules_reach_the_kernels(device, op):
    # F.interpolate's .vec overloads (sizes, recomputed scales) and nn.Upsample call the op: the same kernel, the
    # same result as the op called with those arguments.
    x = values(SHAPES[op.dims], torch.float32)
    kwargs = {} if op.nearest else {"align_corners": False}
    calls = [(lambda v: F.interpolate(v, scale_factor=1.7, mode=op.mode, recompute_scale_factor=True, **kwargs),
              None),
             (lambda v: F.interpolate(v, size=[3] * op.dims, mode=op.mode, **kwargs), None),
             (lambda v: torch.nn.Upsample(scale_factor=2, mode=op.mode, **kwargs)(v), [2.0] * op.dims)]
    for call, scales in calls:
        got, names = run_on(device, call, x)
        assert len(names) == 1 and names[0] in op.forward_kernels(x.dtype), names
        assert_same(got, check_forward(device, op, x, list(got.shape[2:]), scales))


# Calls whose scales disagree with their sizes (an aten call, or F.interpolate(size 4, scale_factor=2.1) -> 8):
# torch's nearest_idx then copies (equal sizes) or halves (twice the size), its generic kernel's helpers multiply
# by the scale; which one a forward takes depends on the layout and the output's size. Linear copies where the sizes
# are equal, whatever the scale.
DISAGREEING = [((4,), (8,), (2.1,)), ((5,), (5,), (1.3,)), ((4, 3), (8, 3), (2.1, 0.7)), ((3, 5), (3, 10), (0.8, 2.6)),
               ((2, 3, 4), (4, 3, 8), (2.3, 1.4, 1.9))]


@pytest.mark.parametrize("op", OPS, ids=str)
def test_scales_that_disagree_with_the_sizes(device, op):
    for in_sizes, out_sizes, scales in DISAGREEING:
        if len(in_sizes) != op.dims:
            continue
        for channels, rows in ((2, 1), (5, 1), (2, 70)):  # C > 3 takes the channels-last kernel; > 128 rows not
            x = values((2, channels, *in_sizes[:-1], in_sizes[-1] * rows), torch.float32)
            size = [*out_sizes[:-1], out_sizes[-1] * rows]
            layouts = [x]
            if op.dims > 1:
                layouts.append(x.contiguous(memory_format=torch.channels_last if op.dims == 2 else
                                            torch.channels_last_3d))
            for v in layouts:
                check_forward(device, op, v, size, list(scales))
        # torch's backward indexes with nearest_idx whatever the layout.
        check_backward(device, op, values((2, 3, *in_sizes), torch.float32), list(out_sizes), list(scales), False,
                       values((2, 3, *out_sizes), torch.float32, seed=1))


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_bicubic_backward_copies_where_no_size_changes(device, dtype):
    # torch's bicubic backward copies the gradient there, whatever the scales (its forward interpolates): the
    # nearest backward kernel, whose nearest_idx copies too, runs it.
    op, shape = Op("bicubic", 2), (2, 3, 5, 6)
    g = values(shape, dtype, seed=1)
    for scales in (None, [0.7, 1.3]):
        got, names = run_on(device, lambda v: op.backward(v, [5, 6], shape, scales, True), g)
        assert names == [f"upsample_backward_nearest_{TYPE[dtype]}_2d"], names
        assert_same(got, op.backward(g, [5, 6], shape, scales, True))


def test_random_arguments_agree_with_torch(device):
    # A seeded sweep of ops, sizes (up and down), scales (none, agreeing with the sizes or not, negative ones, which
    # torch ignores), align_corners and layouts.
    rng = random.Random(7)
    for case in range(200):
        op = rng.choice(OPS)
        shape = (rng.randint(1, 2), rng.randint(1, 5), *(rng.randint(1, 9) for _ in range(op.dims)))
        size = [rng.randint(1, 17) for _ in range(op.dims)]
        scales = rng.choice([None, [rng.choice([0.3, 0.5, 1.0, 1.5, 2.0, 2.1, 3.7, -1.0]) for _ in range(op.dims)]])
        x = values(shape, torch.float32, seed=case)
        if op.dims > 1 and rng.random() < 0.3:
            x = x.contiguous(memory_format=torch.channels_last if op.dims == 2 else torch.channels_last_3d)
        check_forward(device, op, x, size, scales, rng.random() < 0.5)


def views(shape, dtype):
    """Inputs as torch hands them over: channels-last, transposed, sliced at an offset, with gaps, expanded."""
    base = values((2 * shape[0] + 1, *shape[1:-1], 2 * shape[-1] + 3), dtype, seed=5)
    out = {"sliced": base[1::2, ..., 3::2],
           "transposed": values(shape[::-1], dtype).permute(*reversed(range(len(shape)))),
           "expanded": values((1, shape[1], *shape[2:]), dtype).expand(shape)}
    if len(shape) == 4:
        out["channels_last"] = values(shape, dtype).to(memory_format=torch.channels_last)
    if len(shape) == 5:
        out["channels_last_3d"] = values(shape, dtype).to(memory_format=torch.channels_last_3d)
    return out


@pytest.mark.parametrize("op", OPS, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_views(device, op, dtype):
    shape = (2, 5, *SHAPES[op.dims][2:])
    size, scales = form("fractional scale", shape[2:])
    for name, x in views(shape, dtype).items():
        assert x.shape == shape, name
        check_forward(device, op, x, size, scales)


@pytest.mark.parametrize("op", [op for op in OPS if op.nearest and op.dims > 1], ids=str)
@pytest.mark.parametrize("dtype", NEAREST_TYPES, ids=str)
def test_nearest_moves_16_byte_runs_where_aligned_and_element_by_element_elsewhere(device, op, dtype):
    # Each thread moves 16 bytes: channels where they lie last (16 channels are a whole run in every element
    # size), a row's positions where they do not (an output row of 32 is whole runs). A start one element in,
    # or a row or channel count that is not a multiple of the run, takes the elementwise path.
    spatial = (3,) * (op.dims - 1) + (16,)
    size = (5,) * (op.dims - 1) + (32,)
    channels_last = torch.channels_last if op.dims == 2 else torch.channels_last_3d
    for channels in (16, 7):
        shape = (2, channels, *spatial)
        one_in = values((math.prod(shape) + 1,), dtype)[1:]
        shifted_last = one_in.view(2, *spatial, channels).permute(0, -1, *range(1, op.dims + 1))
        assert shifted_last.is_contiguous(memory_format=channels_last)
        for x in (values(shape, dtype), values(shape, dtype).contiguous(memory_format=channels_last),
                  one_in.view(shape), shifted_last):
            check_forward(device, op, x, size, None)
            check_forward(device, op, x, (*size[:-1], 31), None)


def layout(x, name):
    """x in a layout of REPEATS: contiguous, channels-last, or one element into its storage."""
    if name == "last":
        return x.contiguous(memory_format=torch.channels_last if x.dim() == 4 else torch.channels_last_3d)
    if name == "one in":
        return values((x.numel() + 1,), x.dtype)[1:].view(x.shape)
    return x


# (op, dtype, input shape, layout, output size, scales, the kernel: "repeat", "pairs" or None for the elementwise
# one). A repeat kernel runs where every dimension's output index o reads o >> k (a 2^-k scale, or nearest's
# nearest_idx, which halves at twice the size whatever the scale, where torch indexes with it), channels-first rows
# at most double, an element is stored at most 64 times, and the 16-byte runs are aligned.
REPEATS = [
    (Op("nearest-exact", 2), torch.bfloat16, (1, 8, 16, 32), "first", (32, 64), [2.0, 2.0], "pairs"),  # VAE decoder
    (Op("nearest-exact", 2), torch.bfloat16, (2, 32, 5, 3), "last", (10, 6), [2.0, 2.0], "repeat"),
    (Op("nearest", 2), torch.uint8, (1, 16, 3, 16), "last", (6, 32), None, "repeat"),
    (Op("nearest", 2), torch.uint8, (2, 3, 3, 16), "first", (6, 32), None, "pairs"),
    (Op("nearest", 1), torch.float32, (2, 4, 8), "first", (16,), [2.0], "pairs"),
    (Op("nearest-exact", 1), torch.float16, (3, 1, 16), "first", (16,), None, "repeat"),  # the same size: a copy
    (Op("nearest", 3), torch.float32, (1, 4, 2, 3, 8), "first", (4, 6, 16), None, "pairs"),
    (Op("nearest-exact", 3), torch.float32, (1, 4, 2, 3, 2), "last", (8, 12, 8), None, "repeat"),  # 64 copies
    (Op("nearest", 2), torch.float32, (1, 2, 4, 8), "first", (8, 8), [2.0, 1.0], "repeat"),  # heights only
    (Op("nearest", 2), torch.float32, (1, 2, 3, 8), "first", (12, 16), None, "pairs"),  # 4x the height
    (Op("nearest", 2), torch.float32, (1, 8, 3, 3), "last", (6, 6), [2.1, 2.1], "repeat"),  # nearest_idx halves
    (Op("nearest", 2), torch.float32, (1, 2, 3, 8), "first", (6, 16), [2.1, 2.1], "pairs"),  # so does <= 128
    (Op("nearest", 2), torch.float32, (1, 2, 3, 64), "first", (6, 128), [2.1, 2.1], None),  # floor(o / 2.1)
    (Op("nearest-exact", 2), torch.float32, (1, 8, 3, 3), "last", (6, 6), [2.1, 2.1], None),
    (Op("nearest", 2), torch.float32, (1, 2, 4, 8), "one in", (8, 16), None, None),  # misaligned
    (Op("nearest", 2), torch.bfloat16, (1, 2, 4, 6), "first", (8, 12), None, None),  # a row of 6: not 4s
    (Op("nearest", 2), torch.float32, (1, 8, 3, 5), "last", (9, 15), None, None),  # 3x
    (Op("nearest", 2), torch.float32, (1, 2, 3, 8), "first", (6, 32), None, None),  # rows 4x
    (Op("nearest", 3), torch.float32, (1, 4, 2, 3, 2), "last", (16, 12, 8), None, None),  # 128 copies
    (Op("nearest", 2), torch.float32, (1, 6, 3, 3), "last", (6, 6), None, None),  # 6 channels: not 4s
]


@pytest.mark.parametrize("case", range(len(REPEATS)))
def test_nearest_repeats_16_bytes_where_each_element_is_copied_a_power_of_two_times(device, case):
    op, dtype, shape, where, size, scales, kind = REPEATS[case]
    x = layout(values(shape, dtype, seed=case), where)
    checks = mps_ext.sim.checked() if device == "cpu" else contextlib.nullcontext()
    with checks:
        got, names = run_on(device, lambda v: op(v, size, scales), x)
    assert_same(got, op(x, size, scales))
    want = op.forward_kernel(dtype) if kind is None else op.repeat_kernel(dtype, kind == "pairs")
    assert names == [want], names


@pytest.mark.parametrize("op", OPS, ids=str)
def test_empty_batch(device, op):
    x = values((0, 3, *SHAPES[op.dims][2:]), torch.float32)
    mps_ext.overrides.reset_stats()
    got, names = run_on(device, lambda v: op(v, [4] * op.dims, None), x)
    assert_same(got, op(x, [4] * op.dims, None))
    assert names == []  # nothing to launch: the override still took the call
    assert mps_ext.overrides.stats()[f"aten::{op.name}"] == {"hits": 1, "fallbacks": 0, "reasons": {}}


@pytest.mark.parametrize("op", OPS, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_nan_and_inf_travel_as_torch_carries_them(device, op, dtype):
    # Where a weight is 0 an infinity still gives NaN (inf * 0), as in torch's sums: the kernels' weights are
    # torch's, fused multiply-add included.
    x = values(SHAPES[op.dims], dtype, seed=3)
    flat = x.view(-1)
    flat[::5] = float("nan")
    flat[2::7] = float("inf")
    flat[3::11] = -float("inf")
    for name in ("sizes", "fractional scale", "integer scale"):
        size, scales = form(name, x.shape[2:])
        for align_corners in (False,) if op.nearest else (False, True):
            got = check_forward(device, op, x, size, scales, align_corners)
            want = op(x.float(), size, scales, align_corners).to(dtype)
            assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.isinf(), want.isinf())


@pytest.mark.fallback("dtype Double|dtype Byte|dtype Int")
def test_what_the_kernels_do_not_take_goes_to_torch(device):
    if device == "mps":
        pytest.skip("mps holds no float64")
    # float64: torch's CPU kernels compute its source indices and weights in double. uint8 bilinear and bicubic:
    # torch's integer weights. int32 nearest: torch rejects it, with its own error.
    mps_ext.overrides.reset_stats()
    x = values((2, 3, 5, 7), torch.float64)
    with mps_ext.overrides.enabled(device), mps_ext.trace() as t:
        got = [aten.upsample_nearest2d(x, [7, 9]), aten.upsample_bilinear2d(x, [7, 9], False),
               aten.upsample_bilinear2d(values((2, 3, 5, 7), torch.uint8), [7, 9], False),
               aten.upsample_bicubic2d_backward(x, [5, 7], [2, 3, 3, 4], True)]
    assert t.names == []
    want = [aten.upsample_nearest2d(x, [7, 9]), aten.upsample_bilinear2d(x, [7, 9], False),
            aten.upsample_bilinear2d(values((2, 3, 5, 7), torch.uint8), [7, 9], False),
            aten.upsample_bicubic2d_backward(x, [5, 7], [2, 3, 3, 4], True)]
    for g, w in zip(got, want):
        assert_same(g, w)
    stats = mps_ext.overrides.stats()
    assert stats["aten::upsample_bilinear2d"]["reasons"] == {"dtype Double": 1, "dtype Byte": 1}
    assert stats["aten::upsample_bicubic2d_backward"]["reasons"] == {"dtype Double": 1}
    xi = values((2, 3, 5), torch.float32).to(torch.int32)
    with pytest.raises(RuntimeError) as theirs:
        aten.upsample_nearest1d(xi, [9])
    with mps_ext.overrides.enabled(device), pytest.raises(RuntimeError) as ours:
        aten.upsample_nearest1d(xi, [9])
    assert str(ours.value) == str(theirs.value)


@pytest.mark.fallback("sizes past 2\\^23")
def test_sizes_past_what_float_indexes_exactly_go_to_torch(device):
    # Along an interpolated dimension, (o + 0.5) is exact in float below 2^23 elements only.
    x = torch.ones(()).expand(1, 1, 2**23 + 1)
    mps_ext.overrides.reset_stats()
    got, names = run_on(device, lambda v: aten.upsample_nearest1d(v, [3]), x)
    assert names == [] and torch.equal(got, torch.ones(1, 1, 3))
    assert mps_ext.overrides.stats()["aten::upsample_nearest1d"]["fallbacks"] == 1


BAD = [  # (op, input shape, output size): arguments torch rejects
    (Op("nearest", 2), (2, 3, 4, 4), [0, 5]), (Op("nearest", 2), (2, 0, 4, 4), [5, 5]),
    (Op("bilinear", 2), (2, 3, 0, 4), [5, 5]), (Op("bilinear", 2), (2, 3, 4), [5, 5]),
    (Op("nearest-exact", 1), (2, 3, 4), [5, 5]), (Op("trilinear", 3), (2, 3, 4, 4), [2, 2, 2]),
    (Op("bicubic", 2), (3, 4, 4), [5, 5]), (Op("linear", 1), (2, 3, 4), [-1]),
]


@pytest.mark.fallback("invalid arguments", required=False)
@pytest.mark.parametrize("op, shape, size", BAD, ids=str)
def test_what_torch_rejects_raises_torchs_error(device, op, shape, size):
    x = values(shape, torch.float32)
    with pytest.raises((RuntimeError, ValueError, IndexError)) as theirs:
        op(x, size, None)
    with mps_ext.overrides.enabled(device), pytest.raises(type(theirs.value)) as ours:
        on(device, lambda v: op(v, size, None), x)
    if device == "cpu":
        assert str(ours.value) == str(theirs.value)


@pytest.mark.fallback("invalid arguments")
def test_a_backward_whose_gradient_has_the_wrong_shape_raises_torchs_error(device):
    g = values((2, 3, 6, 7), torch.float32)
    with pytest.raises(RuntimeError) as theirs:
        aten.upsample_bilinear2d_backward(g, [6, 8], [2, 3, 3, 4], False)
    with mps_ext.overrides.enabled(device), pytest.raises(RuntimeError) as ours:
        on(device, lambda v: aten.upsample_bilinear2d_backward(v, [6, 8], [2, 3, 3, 4], False), g)
    if device == "cpu":
        assert str(ours.value) == str(theirs.value)


# ------------------------------------------------------------------------------------------------ backward

def grad_of(device, op, x, size, scales, align_corners, cotangent):
    x = to_device(device, x).detach().requires_grad_()
    with mps_ext.overrides.enabled(device), mps_ext.trace() as t:
        op(x, size, scales, align_corners).backward(to_device(device, cotangent))
    assert all(k.backend == backend(device) for k in t.kernels), t.names
    return x.grad.cpu(), t.names


def check_backward(device, op, x, size, scales, align_corners, cotangent):
    """The input's gradient with the overrides on (through autograd, and from the backward op called alone) is the
    float64 one within the rounding of its sums, ran the op's kernels, has the same bits every run, and the backward
    op lays it out as torch's does."""
    got, names = grad_of(device, op, x, size, scales, align_corners, cotangent)
    assert len(names) == 2 and names[0] in op.forward_kernels(x.dtype), names
    assert names[1] == op.backward_kernel(x.dtype), names
    ws = matrices(op, x.shape[2:], size, scales, align_corners)
    if op.family == "cubic" and list(x.shape[2:]) == list(size):
        ws = [torch.eye(n, dtype=torch.float64) for n in size]  # torch's bicubic backward copies, whatever the scales
    want = through(cotangent, [w.T for w in ws])
    assert_close_dot(got, want, magnitude(op, cotangent, [w.T for w in ws]), terms(op, ws, backward=True))
    again, _ = grad_of(device, op, x, size, scales, align_corners, cotangent)
    assert torch.equal(bits(got), bits(again))  # a fixed order of summation: the same bits every run
    # Autograd lays the gradient out as x is laid out; the op itself as torch's op does.
    alone, names = run_on(device, lambda g: op.backward(g, size, x.shape, scales, align_corners), cotangent)
    assert names == [op.backward_kernel(x.dtype)], names
    assert alone.stride() == op.backward(cotangent, size, x.shape, scales, align_corners).stride()
    assert torch.equal(bits(alone), bits(got))


@pytest.mark.parametrize("op", OPS, ids=str)
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_backward(device, op, dtype):
    shape = SHAPES[op.dims]
    for i, name in enumerate(FORMS):
        size, scales = form(name, shape[2:])
        for align_corners in (False,) if op.nearest else (False, True):
            x = values(shape, dtype, seed=i)
            cotangent = values((*shape[:2], *size), dtype, seed=i + 10)
            check_backward(device, op, x, size, scales, align_corners, cotangent)


@pytest.mark.parametrize("op", OPS, ids=str)
def test_backward_of_strided_gradients(device, op):
    # The gradient of a sum arrives expanded (stride 0 everywhere); others transposed or channels-last, and the
    # input's gradient is laid out as torch lays it out.
    shape = (2, 5, *SHAPES[op.dims][2:])
    size, scales = form("fractional scale", shape[2:])
    out = (*shape[:2], *size)
    cotangents = [torch.ones(()).expand(out), values(out[::-1], torch.float32).permute(*reversed(range(len(out))))]
    if op.dims > 1:
        cotangents.append(values(out, torch.float32).contiguous(
            memory_format=torch.channels_last if op.dims == 2 else torch.channels_last_3d))
    for cotangent in cotangents:
        check_backward(device, op, values(shape, torch.float32), size, scales, False, cotangent)


@pytest.mark.parametrize("op", OPS, ids=str)
def test_forward_derivative(device, op):
    shape = SHAPES[op.dims]
    size, scales = form("fractional scale", shape[2:])
    x, tangent = values(shape, torch.float32), values(shape, torch.float32, seed=1)
    with mps_ext.overrides.enabled(device), mps_ext.trace() as t, forward_ad.dual_level():
        dual = forward_ad.make_dual(to_device(device, x), to_device(device, tangent))
        got = forward_ad.unpack_dual(op(dual, size, scales, True)).tangent.cpu()
    assert set(t.names) == {op.forward_kernel(torch.float32)}, t.names
    want = op(tangent, size, scales, True)
    ws = matrices(op, shape[2:], size, scales, True)
    assert_close_dot(got, want, magnitude(op, tangent, ws), terms(op, ws))


def test_checked_mode(device):
    if device != "cpu":
        pytest.skip("the simulator's checks")
    with mps_ext.sim.checked():
        for op in OPS:
            shape = (2, 5, *SHAPES[op.dims][2:])
            for name in ("fractional scale", "downsampling"):
                size, scales = form(name, shape[2:])
                for dtype in NEAREST_TYPES if op.nearest else FLOATS:
                    check_forward(device, op, views(shape, dtype)["sliced"], size, scales, True)
                for dtype in FLOATS:
                    x = views(shape, dtype)["sliced"]
                    check_backward(device, op, x, size, scales, True, values((*shape[:2], *size), dtype, seed=2))


# ------------------------------------------------------------------------------------------------ opcheck

# torch's C++ meta kernels of these backward ops take no symbolic sizes (the isIntList assertion of
# pytorch/pytorch#197092) and torch 2.13 registers no Python one, so AOTAutograd's dynamic-shape trace of the
# forward op's gradient fails in torch, overrides on or off. The other forward ops leave no backward op in the
# graph (torch's Python decompositions replace them: test_opcheck), and a backward op's own sizes are constants.
NO_DYNAMIC_BACKWARD = {"upsample_linear1d", "upsample_trilinear3d"}


def opcheck_utils(device, name):
    """opcheck's default tests; torch's autograd registration check raises NotImplementedError for mps tensors."""
    aot = "test_aot_dispatch_static" if name in NO_DYNAMIC_BACKWARD else "test_aot_dispatch_dynamic"
    utils = ["test_schema", "test_autograd_registration", "test_faketensor", aot]
    return [u for u in utils if device == "cpu" or u != "test_autograd_registration"]


def fake_check(op, args):
    """The op's meta kernel, which torch.compile traces with, gives the kernels' output shape, strides and aliasing.
    opcheck's test_faketensor does not compare them for aten ops (it ignores builtin ones)."""
    with CrossRefFakeMode():
        op(*args)


def other_layout(t):
    """t's values in another layout: channels-last where its rank has one (the output follows it), else transposed."""
    t = t.detach()
    if t.dim() in (4, 5):
        t = t.contiguous(memory_format=torch.channels_last if t.dim() == 4 else torch.channels_last_3d)
    else:
        t = t.mT.contiguous().mT
    return t.requires_grad_()


@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
@pytest.mark.parametrize("op", OPS, ids=str)
def test_opcheck(device, op, backward):
    # AOTAutograd's graph keeps upsample_linear1d and upsample_trilinear3d, so its half of the comparison runs the
    # kernels too; the nearest, nearest-exact, bilinear and bicubic ops (the forward, or the double backward's) are
    # torch's Python decompositions there (their Autograd py_impl), so eager mode's kernels are compared with those,
    # and only the trace shows the kernels ran. The scales agree with the sizes: with others, the nearest
    # decompositions index past the input (they do not clamp as torch's kernels do).
    shape = SHAPES[op.dims]
    size, scales = form("fractional scale", shape[2:])
    flag = () if op.nearest else (False,)
    if backward:  # the gradient of grad_output is the forward op's: a double backward
        g = to_device(device, values((*shape[:2], *size), torch.float32, seed=1)).requires_grad_()
        name, args, derivative = op.name + "_backward", (g, size, list(shape), *flag, *scales), op.name
    else:
        x = to_device(device, values(shape, torch.float32)).requires_grad_()
        name, args, derivative = op.name, (x, size, *flag, *scales), op.name + "_backward"
    aten_op = getattr(aten, name).default
    mps_ext.overrides.reset_stats()
    with mps_ext.overrides.enabled(device), mps_ext.trace() as t:
        torch.library.opcheck(aten_op, args, test_utils=opcheck_utils(device, name))
        fake_check(aten_op, args)
        fake_check(aten_op, (other_layout(args[0]), *args[1:]))
    assert set(t.names) == {op.forward_kernel(torch.float32), op.backward_kernel(torch.float32)}, t.names
    assert all(k.backend == backend(device) for k in t.kernels), t.names
    stats = mps_ext.overrides.stats()
    assert set(stats) == {f"aten::{name}", f"aten::{derivative} (backward)"}, stats
    assert all(s["hits"] and not s["fallbacks"] for s in stats.values()), stats


# ------------------------------------------------------------------------------------------------ clients

@pytest.mark.parametrize("channels_last", [False, True])
def test_a_vae_decoders_2x_nearest_exact_upsampling(device, channels_last):
    # (1, 8, 64, 64) to (1, 8, 128, 128), as the VAE decoders of Qwen-Image and Wan upsample (scale factor 2): the
    # contiguous input takes torch's generic kernel's indexing, the channels-last one (C > 3) its channels-last
    # kernel's.
    op = Op("nearest-exact", 2)
    x = values((1, 8, 64, 64), torch.float32)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    check_forward(device, op, x, [128, 128], [2.0, 2.0])
    check_backward(device, op, x, [128, 128], [2.0, 2.0], False, values((1, 8, 128, 128), torch.float32, seed=1))


@pytest.mark.parametrize("vae", ["AutoencoderKLQwenImage", "AutoencoderKLWan"])
def test_diffusers_vae_decoders_run_the_kernels(vae):
    # The real classes, a small configuration, random weights: their decoders' upsampling (nn.Upsample's
    # nearest-exact, aten::_upsample_nearest_exact2d) and its backward run the kernels, so does the mid-block
    # attention (its input needs a derivative: the training kernels), and the decode is torch's to float32's
    # rounding (the attention's sums).
    diffusers = pytest.importorskip("diffusers")
    torch.manual_seed(0)
    model = getattr(diffusers, vae)(base_dim=8, z_dim=4, dim_mult=[1, 2], num_res_blocks=1, temperal_downsample=[False],
                                    latents_mean=[0.0] * 4, latents_std=[1.0] * 4).eval()
    z = torch.randn(1, 4, 1, 4, 4)
    with torch.no_grad():
        want = model.decode(z).sample
    z = z.requires_grad_()
    mps_ext.overrides.reset_stats()
    with mps_ext.overrides.enabled("cpu"), mps_ext.trace() as t:
        got = model.decode(z).sample
        got.square().sum().backward()
    assert_close(got.detach(), want, scale=reduction_scale(torch.float32, 16))
    assert {"upsample_repeat_pairs_uint_2d", "upsample_backward_nearest_exact_float_2d", "attention_backward_dq_float_d32",
            "attention_backward_dkv_float_d32"} <= set(t.names), t.names
    stats = mps_ext.overrides.stats()
    assert stats["aten::_upsample_nearest_exact2d"]["hits"] >= 1
    assert stats["aten::_upsample_nearest_exact2d_backward (backward)"]["hits"] >= 1
