"""Padding (F.pad: constant_pad_nd, reflection_pad{1,2,3}d, replication_pad{1,2,3}d and their backward) with
the overrides on, against torch's CPU kernels: forward bit for bit in every dtype torch pads, in torch's
layout, over views, negative pads, empty inputs and the 5-D shapes MPSGraph corrupts on torch 2.13 and 2.14;
backward within the dtype's tolerance and the same bits every run; torch's errors for what torch rejects; opcheck
and the meta kernels' shapes and strides."""

import contextlib
import random
import threading

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_utils import CrossRefFakeMode
from torch.autograd import forward_ad

import mps_ext
from conftest import backend, on, to_device
from tolerances import assert_close

ALL = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.bfloat16,
       torch.float32, torch.float64, torch.complex64, torch.complex128, torch.float8_e4m3fn, torch.uint16]
# What torch's CPU reflection and replication kernels take.
BORDER = [t for t in ALL if t not in (torch.bool, torch.float8_e4m3fn, torch.uint16)]
GRADIENT = [torch.float32, torch.float16, torch.bfloat16, torch.complex64]
MPS_TYPES = {torch.float64, torch.complex128}  # no mps tensors of these
TYPE_OF_SIZE = {1: "uchar", 2: "ushort", 4: "uint", 8: "ulong", 16: "uint4"}


def values(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_floating_point or dtype.is_complex:
        x = torch.randn(shape, generator=g, dtype=torch.complex128 if dtype.is_complex else torch.float64)
        x.view(-1)[::7] = float("nan") if x.numel() > 7 else x.view(-1)[::7]  # NaNs travel as they are
        return (x * 4).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(max(info.min, -1000), min(info.max, 1000), shape, generator=g).to(dtype)


def skip_unless_on(device, dtype):
    if device == "mps" and dtype in MPS_TYPES:
        pytest.skip(f"mps has no {dtype}")


def pad_on(device, x, pad, mode="constant", value=None):
    """F.pad on ``device`` with the overrides on, and the kernels it ran."""
    kwargs = {} if mode != "constant" or value is None else {"value": value}
    with mps_ext.overrides.enabled(device), mps_ext.trace() as t:
        out = on(device, lambda v: F.pad(v, pad, mode=mode, **kwargs), x)
    assert all(k.backend == backend(device) for k in t.kernels), t.names
    return out, t.names


def bits(t):
    return t.contiguous().view(torch.uint8) if t.dtype != torch.bool else t.contiguous()


def assert_same(got, want):
    """Same shape, strides, dtype and bytes (NaNs included)."""
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
    if got.numel():
        assert got.stride() == want.stride(), (got.stride(), want.stride())
    assert torch.equal(bits(got), bits(want))


def check_forward(device, x, pad, mode="constant", value=None):
    """F.pad with the overrides on is torch's, and ran exactly the pad kernel."""
    kwargs = {} if mode != "constant" or value is None else {"value": value}
    want = F.pad(x, pad, mode=mode, **kwargs)
    got, names = pad_on(device, x, pad, mode, value)
    assert_same(got, want)
    if want.numel():
        assert names == [f"pad_{mode}_{TYPE_OF_SIZE[x.element_size()]}"], names
    return got


SHAPES = {  # mode -> (shape, pad) pairs: each padded rank, batched or not, negative pads (crops), odd sizes
    "constant": [((7,), (2, 3)), ((3, 5), (0, 0, 1, 2)), ((2, 3, 9), (-2, 3)), ((2, 3, 5, 9), (1, -1, 3, 0)),
                 ((1, 2, 3, 4, 5), (1, 1, 2, 0, 0, 2)), ((2, 1, 3, 1, 2, 3), (1, 0, 0, 1, 1, 0, 0, 1, 2, 2, 1, 0)),
                 ((4, 33), (16, 15))],
    "reflect": [((3, 7), (2, 3)), ((2, 3, 9), (-2, 3)), ((3, 5, 9), (1, 2, 3, 4)), ((2, 3, 5, 9), (4, -1, 3, 0)),
                ((2, 3, 3, 4, 5), (1, 1, 2, 0, 0, 2)), ((4, 40), (8, 8))],
    "replicate": [((3, 7), (5, 9)), ((2, 3, 9), (-2, 3)), ((3, 5, 9), (1, 2, 3, 4)), ((2, 3, 5, 9), (4, -1, 3, 0)),
                  ((2, 3, 3, 4, 5), (1, 1, 2, 0, 0, 2)), ((4, 40), (8, 8))],
}


@pytest.mark.parametrize("dtype", ALL, ids=str)
@pytest.mark.parametrize("mode", list(SHAPES))
def test_forward_is_torchs_bit_for_bit(device, mode, dtype):
    if mode != "constant" and dtype not in BORDER:
        pytest.skip(f"torch's {mode} pad does not take {dtype}")
    skip_unless_on(device, dtype)
    for i, (shape, pad) in enumerate(SHAPES[mode]):
        check_forward(device, values(shape, dtype, seed=i), pad, mode)


@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8, torch.int32, torch.float16, torch.bfloat16,
                                   torch.float32, torch.complex64], ids=str)
@pytest.mark.parametrize("value", [0, 1, 2.75, -3, True])
def test_the_fill_value_is_cast_as_torch_casts_it(device, dtype, value):
    skip_unless_on(device, dtype)
    if dtype == torch.uint8 and value == -3:
        value = 250
    check_forward(device, values((3, 5, 6), dtype), (2, 1, 1, 3), value=value)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int32], ids=str)
def test_a_fill_value_the_dtype_cannot_hold_raises_as_torch(device, dtype):
    x = values((3, 4), dtype)
    with pytest.raises(RuntimeError) as theirs:
        F.pad(x, (1, 1), value=1e12)
    with mps_ext.overrides.enabled(device), pytest.raises(RuntimeError) as ours:
        on(device, lambda v: F.pad(v, (1, 1), value=1e12), x)
    assert str(ours.value) == str(theirs.value)


def views(shape, dtype):
    """Inputs as torch hands them over: transposed, channels-last, sliced at an offset, with gaps, expanded,
    with lazy conjugate and negative bits."""
    base = values((2 * shape[0] + 1, *shape[1:-1], 2 * shape[-1] + 3), dtype, seed=5)
    out = {"sliced": base[1::2, ..., 3::2], "transposed": values(shape[::-1], dtype).permute(*reversed(range(len(shape))))}
    if len(shape) == 4:
        out["channels_last"] = values(shape, dtype).to(memory_format=torch.channels_last)
    if len(shape) == 5:
        out["channels_last_3d"] = values(shape, dtype).to(memory_format=torch.channels_last_3d)
    out["expanded"] = values((1, *shape[1:]), dtype).expand(shape)
    if dtype.is_complex:
        out["conj"] = values(shape, dtype).conj()
    if dtype.is_floating_point or dtype.is_complex:
        out["neg"] = torch._neg_view(values(shape, dtype))
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.complex64, torch.int8], ids=str)
@pytest.mark.parametrize("mode", list(SHAPES))
@pytest.mark.parametrize("rank", [3, 4, 5])
def test_views(device, mode, rank, dtype):
    shape, pad = {3: ((2, 3, 9), (2, 3)), 4: ((2, 3, 5, 9), (1, 2, 3, 0)),
                  5: ((2, 3, 3, 4, 5), (1, 1, 2, 0, 0, 2))}[rank]
    for name, x in views(shape, dtype).items():
        assert x.shape == shape, name
        check_forward(device, x, pad, mode)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("mode", list(SHAPES))
def test_the_5d_frames_mpsgraph_overwrites(device, mode, dtype):
    """Frames of H * W >= 65,536 elements padded along time, as Qwen-Image's VAE encoder pads (AvgDown3D) and
    Wan's causal 3-D convolutions do: MPSGraph's padTensor writes the fill value over most of the input there
    (torch 2.13 and 2.14 on mps)."""
    x = values((1, 2, 3, 256, 257), dtype)
    pad = {"constant": (0, 0, 0, 0, 2, 0), "reflect": (1, 1, 1, 1, 2, 0), "replicate": (0, 0, 0, 0, 2, 1)}[mode]
    check_forward(device, x, pad, mode)


def test_rows_of_any_length_and_padding(device):
    # Each thread writes 16 bytes of the output in memory order, whatever the rows' length (shorter than 16 bytes
    # too: a chunk then spans rows). It reads them with one aligned load, or two shifted into place where the
    # padding before a row is not a multiple of 16 bytes, element by element at the rows' ends, in the borders and
    # where the input is not aligned; in the simulator's checked mode, so no load strays past its row.
    checks = mps_ext.sim.checked() if device == "cpu" else contextlib.nullcontext()
    with checks:
        for dtype in (torch.uint8, torch.float16, torch.float32, torch.float64):
            per = 16 // dtype.itemsize
            for before in range(per + 1):
                for width in (4 * per, 4 * per + 3, 3):
                    x = values((3, width), dtype, seed=before)
                    check_forward(device, x, (before, 5))
                    check_forward(device, x, (before, 2), "replicate")
            one_in = values((3 * 4 * per + 1,), dtype)[1:].view(3, 4 * per)
            check_forward(device, one_in, (1, 1))
            check_forward(device, one_in, (per, 0))
        # A causal 3-D convolution's border: one pixel around each frame, two frames before.
        check_forward(device, values((1, 2, 3, 8, 24), torch.bfloat16), (1, 1, 1, 1, 2, 0))
        check_forward(device, values((1, 2, 3, 8, 24), torch.bfloat16), (1, 1, 1, 1, 2, 0), "replicate")


@pytest.mark.parametrize("mode", list(SHAPES))
def test_empty(device, mode):
    if mode == "constant":
        check_forward(device, values((0, 3), torch.float32), (1, 2, 3, 4))  # empty input, padded into fills
        check_forward(device, values((2, 3), torch.float32), (1, 2, -1, -1))  # cropped to nothing
        check_forward(device, values((2, 0, 4), torch.float32), (1, 1))
    else:
        check_forward(device, values((0, 3, 4), torch.float32), (1, 2), mode)  # an empty batch


BAD = [  # arguments torch rejects: (mode, shape, pad)
    ("constant", (3, 4), (1, 2, 3)), ("constant", (3,), (1, 1, 1, 1)), ("constant", (3, 4), (-3, -2)),
    ("reflect", (2, 3, 4), (4, 0)), ("reflect", (2, 3, 4), (0, 4)), ("reflect", (3, 4), (1, 2, 3, 4)),
    ("reflect", (2, 0, 4), (1, 1)), ("reflect", (4,), (1, 1)), ("replicate", (2, 3, 4), (-3, -1)),
    ("replicate", (2, 3, 0), (1, 1)), ("replicate", (1, 2, 3, 4, 5, 6), (1, 1)), ("constant", (1, 2), (3, -4)),
]


@pytest.mark.fallback("invalid arguments", required=False)  # F.pad itself rejects some
@pytest.mark.parametrize("mode, shape, pad", BAD)
def test_what_torch_rejects_raises_torchs_error(device, mode, shape, pad):
    x = values(shape, torch.float32)
    with pytest.raises((RuntimeError, ValueError, NotImplementedError)) as theirs:
        F.pad(x, pad, mode=mode)
    with mps_ext.overrides.enabled(device), pytest.raises(type(theirs.value)) as ours:
        on(device, lambda v: F.pad(v, pad, mode=mode), x)
    if device == "cpu":
        assert str(ours.value) == str(theirs.value)


@pytest.mark.fallback("invalid arguments", required=False)
def test_random_arguments_agree_with_torch(device):
    # A seeded sweep of ranks, sizes and pads (negative, larger than the input): ours raises where torch raises,
    # and gives torch's result, bit for bit, where it does not.
    rng = random.Random(3)
    for case in range(150):
        mode = rng.choice(list(SHAPES))
        rank = rng.randint(2, 5) if mode != "constant" else rng.randint(1, 5)
        shape = tuple(rng.randint(0 if d == 0 else 1, 6) for d in range(rank))
        padded = rng.randint(1, min(rank, 3)) if mode == "constant" else rng.randint(max(rank - 2, 1), min(rank - 1, 3))
        pad = tuple(rng.randint(-4, 6) for _ in range(2 * padded))
        x = values(shape, torch.float32, seed=case)
        try:
            want = F.pad(x, pad, mode=mode)
        except (RuntimeError, ValueError, NotImplementedError) as e:
            with mps_ext.overrides.enabled(device), pytest.raises(type(e)):
                on(device, lambda v: F.pad(v, pad, mode=mode), x)
            continue
        got, _ = pad_on(device, x, pad, mode)
        assert_same(got, want)


def test_checked_mode(device):
    if device != "cpu":
        pytest.skip("the simulator's checks")
    with mps_ext.sim.checked():
        for mode in SHAPES:
            for dtype in (torch.uint8, torch.float16, torch.float32, torch.float64, torch.complex128):
                if mode == "constant" or dtype in BORDER:
                    check_forward(device, values((2, 3, 5, 9), dtype)[:, :, 1:, ::2], (1, 2, 3, 0), mode)
        for mode in ("reflect", "replicate"):
            x = values((2, 3, 5, 9), torch.float32).requires_grad_()
            with mps_ext.overrides.enabled(device), mps_ext.trace() as t:
                F.pad(x, (2, 3, 4, 1), mode=mode).backward(values((2, 3, 10, 14), torch.float32, seed=1))
            assert t.names == [f"pad_{mode}_uint", f"pad_backward_{mode}_float"], t.names


# ------------------------------------------------------------------------------------------------ backward

BACKWARD = [((3, 7), (2, 3)), ((2, 3, 9), (-2, 3)), ((2, 3, 5, 9), (4, 1, 3, 4)), ((2, 2, 3, 4, 5), (1, 2, 2, 0, 3, 2)),
            ((2, 3, 8), (7, 7))]


def grad_of(device, x, pad, mode, cotangent):
    x = to_device(device, x).detach().requires_grad_()
    with mps_ext.overrides.enabled(device), mps_ext.trace() as t:
        F.pad(x, pad, mode=mode).backward(to_device(device, cotangent))
    return x.grad.cpu(), t.names


@pytest.mark.parametrize("dtype", GRADIENT, ids=str)
@pytest.mark.parametrize("mode", ["reflect", "replicate"])
def test_backward(device, mode, dtype):
    for i, (shape, pad) in enumerate(BACKWARD):
        if mode == "reflect" and max(pad) >= min(shape[-len(pad) // 2:]):
            continue  # reflection needs pads below the size
        x = values(shape, dtype, seed=i).nan_to_num()
        cotangent = values(F.pad(x, pad, mode=mode).shape, dtype, seed=i + 1).nan_to_num()
        got = check_backward(device, x, pad, mode, cotangent=cotangent)
        again, _ = grad_of(device, x, pad, mode, cotangent)
        assert torch.equal(bits(got), bits(again))  # a fixed order of summation: the same bits every run


def test_backward_rows_of_any_length_and_padding(device):
    # Each thread writes 16 bytes of the gradient. Away from every border each element is its own output
    # position's gradient, read with one aligned load or two shifted into place (the output's rows need not be
    # aligned); at the borders, across rows shorter than 16 bytes, where a shifted load would pass its row's end
    # and where the gradient is not aligned, element by element. In the simulator's checked mode, so no load
    # strays past its row, and with -0 in the gradient, which torch sums into zeros: +0.
    checks = mps_ext.sim.checked() if device == "cpu" else contextlib.nullcontext()
    with checks:
        for dtype in GRADIENT:
            per = 16 // dtype.itemsize
            for i, (before, width) in enumerate((b, w) for b in range(per + 1) for w in (4 * per, 4 * per + 3, 3)):
                shape, pad = (2, 5, width), (before, min(2, width - 1), 1, 2)
                for mode in ("reflect", "replicate"):
                    if mode == "reflect" and before >= width:
                        continue
                    check_backward(device, values(shape, dtype, seed=i), pad, mode, seed=i)
            x = values((2, 5, 4 * per), dtype)
            cotangent = values((2, 8, 4 * per + 3), dtype, seed=3).nan_to_num()
            unaligned = torch.cat([cotangent.new_zeros(1), cotangent.flatten()])[1:].view(cotangent.shape)
            check_backward(device, x, (1, 2, 1, 2), "replicate", cotangent=unaligned)
            check_backward(device, x, (-1, 3, 2, 1), "reflect")  # a crop along the rows
            zeros = torch.full((2, 8, 4 * per + 3), -0.0, dtype=dtype)
            got = check_backward(device, x, (1, 2, 1, 2), "replicate", cotangent=zeros)
            assert not got.real.signbit().any() if dtype.is_complex else not got.signbit().any()


def check_backward(device, x, pad, mode, seed=0, cotangent=None):
    """The overrides' gradient of F.pad is torch's (summed in float64), from the backward kernel of x's type."""
    if cotangent is None:
        cotangent = values(F.pad(x, pad, mode=mode).shape, x.dtype, seed=seed + 1).nan_to_num()
    wide = torch.complex128 if x.dtype.is_complex else torch.float64
    xw = x.to(wide).requires_grad_()
    F.pad(xw, pad, mode=mode).backward(cotangent.to(wide))
    got, names = grad_of(device, x, pad, mode, cotangent)
    assert names[-1] == f"pad_backward_{mode}_{'float2' if x.dtype.is_complex else mps_ext_type(x.dtype)}", names
    # Each gradient element sums at most (pad + 1)^3 terms of the cotangent.
    assert_close(got, xw.grad.to(x.dtype), scale=2)
    return got


def mps_ext_type(dtype):
    return {torch.float32: "float", torch.float16: "half", torch.bfloat16: "bfloat"}[dtype]


@pytest.mark.parametrize("mode", ["reflect", "replicate"])
def test_backward_of_strided_gradients(device, mode):
    # The gradient of a sum arrives expanded (stride 0 everywhere); a transposed one strided.
    x = values((2, 3, 6, 7), torch.float32)
    xw = x.double().requires_grad_()
    F.pad(xw, (2, 1, 3, 0), mode=mode).sum().backward()
    dx = to_device(device, x).requires_grad_()
    with mps_ext.overrides.enabled(device), mps_ext.trace() as t:
        F.pad(dx, (2, 1, 3, 0), mode=mode).sum().backward()
    assert f"pad_backward_{mode}_float" in t.names, t.names
    assert_close(dx.grad.cpu(), xw.grad.float())
    cotangent = values((2, 3, 10, 9), torch.float32, seed=2).nan_to_num().mT.contiguous().mT
    got, _ = grad_of(device, x, (1, 1, 2, 2), mode, cotangent)
    xw.grad = None
    F.pad(xw, (1, 1, 2, 2), mode=mode).backward(cotangent.double())
    assert_close(got, xw.grad.float())


def test_constant_pad_backward_crops_with_the_kernel(device):
    x = to_device(device, values((2, 3, 5), torch.float32).nan_to_num()).requires_grad_()
    cotangent = values((2, 5, 8), torch.float32, seed=1)
    with mps_ext.overrides.enabled(device), mps_ext.trace() as t:
        F.pad(x, (1, 2, 1, 1)).backward(to_device(device, cotangent))
    assert t.names == ["pad_constant_uint", "pad_constant_uint"], t.names
    assert torch.equal(bits(x.grad.cpu()), bits(cotangent[:, 1:4, 1:6]))


@pytest.mark.parametrize("mode", list(SHAPES))
def test_forward_derivative(device, mode):
    x, tangent = values((2, 3, 6, 7), torch.float32).nan_to_num(), values((2, 3, 6, 7), torch.float32, 1).nan_to_num()
    want = F.pad(tangent, (2, 1, 3, 0), mode=mode)
    with mps_ext.overrides.enabled(device), mps_ext.trace() as t, forward_ad.dual_level():
        dual = forward_ad.make_dual(to_device(device, x), to_device(device, tangent))
        got = forward_ad.unpack_dual(F.pad(dual, (2, 1, 3, 0), mode=mode)).tangent.cpu()
    assert set(t.names) == {f"pad_{mode}_uint"}, t.names
    assert_same(got, want)


def test_float64_gradients_go_to_torch():
    # The forward moves bytes (every dtype); the backward sums in float, so float64 gradients are torch's.
    x = values((2, 3, 6), torch.float64).nan_to_num().requires_grad_()
    mps_ext.overrides.reset_stats()
    with mps_ext.overrides.enabled("cpu"):
        assert torch.autograd.gradcheck(lambda v: F.pad(v, (2, 3), mode="reflect"), (x,))
    stats = mps_ext.overrides.stats()
    assert stats["aten::reflection_pad1d"]["fallbacks"] == 0
    assert stats["aten::reflection_pad1d_backward (backward)"]["reasons"] == {"dtype Double": stats[
        "aten::reflection_pad1d_backward (backward)"]["fallbacks"]}


def test_threads(device):
    # Pads from several threads at once (the overrides are on for all of them), each compared with torch's,
    # computed before.
    inputs = [values((2, 3, 17, 33), torch.float32, seed=s) for s in range(4)]
    wants = [[F.pad(x, (1, 2, 3, 4), mode=mode) for mode in SHAPES] for x in inputs]
    errors = []

    def run(x, want):
        try:
            for mode, w in zip(SHAPES, want):
                assert_same(on(device, lambda v: F.pad(v, (1, 2, 3, 4), mode=mode), x), w)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=args) for args in zip(inputs, wants)]
    mps_ext.overrides.reset_stats()
    with mps_ext.overrides.enabled(device):
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors, errors
    stats = mps_ext.overrides.stats()
    assert all(stats[f"aten::{op}"]["hits"] == 4 for op in ("constant_pad_nd", "reflection_pad2d", "replication_pad2d"))


# ------------------------------------------------------------------------------------------------ opcheck

OPCHECK = {  # op -> (input shape, pad): odd sizes, a crop among constant_pad_nd's pads
    "constant_pad_nd": ((2, 3, 5), (1, 2, -1, 1)), "reflection_pad1d": ((2, 3, 7), (2, 3)),
    "reflection_pad2d": ((1, 3, 5, 7), (2, 1, 3, 0)), "reflection_pad3d": ((1, 2, 3, 5, 3), (1, 2, 2, 0, 1, 1)),
    "replication_pad1d": ((2, 3, 7), (2, 3)), "replication_pad2d": ((1, 3, 5, 7), (2, 1, 3, 0)),
    "replication_pad3d": ((1, 2, 3, 5, 3), (1, 2, 2, 0, 1, 1)),
}
# constant_pad_nd has no backward op: its derivative is a constant_pad_nd that crops.
PAD_OPS = [*OPCHECK, *(f"{op}_backward" for op in OPCHECK if op != "constant_pad_nd")]
MODE_OF = {"constant": "constant", "reflection": "reflect", "replication": "replicate"}


def opcheck_utils(device):
    """opcheck's default tests; torch's autograd registration check raises NotImplementedError for mps tensors."""
    utils = ["test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"]
    return [u for u in utils if device == "cpu" or u != "test_autograd_registration"]


def fake_check(op, args):
    """The op's meta kernel, which torch.compile traces with, gives the kernels' output shape, strides and aliasing.
    opcheck's test_faketensor does not compare them for aten ops (it ignores builtin ones)."""
    with CrossRefFakeMode():
        op(*args)


def transposed(t):
    # Not channels-last: torch 2.13's meta kernels of reflection_pad3d and replication_pad3d, and of the 2-D and
    # 3-D backward ops, give a contiguous result where torch's CPU kernels (and so ours: test_views) keep the
    # input's channels-last layout.
    return t.detach().mT.contiguous().mT.requires_grad_(t.requires_grad)


@pytest.mark.parametrize("name", PAD_OPS)
def test_opcheck(device, name):
    # AOTAutograd's graph keeps the pad ops, so both halves of its comparison (outputs and gradients) run the
    # kernels: the trace and the counts show they ran, not torch's.
    forward = name.removesuffix("_backward")
    shape, pad = OPCHECK[forward]
    mode = MODE_OF[forward.split("_")[0]]
    x = to_device(device, values(shape, torch.float32).nan_to_num())  # assert_close takes no NaNs
    if name == forward:
        args = (x.requires_grad_(), list(pad), *((0.5,) if mode == "constant" else ()))
        derivative = name if mode == "constant" else f"{name}_backward"
    else:  # the gradient of grad_output is the forward op's: a double backward
        g = values(F.pad(torch.empty(shape, device="meta"), pad, mode=mode).shape, torch.float32, seed=1).nan_to_num()
        args = (to_device(device, g).requires_grad_(), x, list(pad))
        derivative = forward
    op = getattr(torch.ops.aten, name).default
    mps_ext.overrides.reset_stats()
    with mps_ext.overrides.enabled(device), mps_ext.trace() as t:
        torch.library.opcheck(op, args, test_utils=opcheck_utils(device))
        fake_check(op, args)
        fake_check(op, (transposed(args[0]), *args[1:]))
    kernels = {f"pad_{mode}_uint", *(() if mode == "constant" else (f"pad_backward_{mode}_float",))}
    assert set(t.names) == kernels and all(k.backend == backend(device) for k in t.kernels), t.names
    stats = mps_ext.overrides.stats()
    assert set(stats) == {f"aten::{name}", f"aten::{derivative} (backward)"}, stats
    assert all(s["hits"] and not s["fallbacks"] for s in stats.values()), stats
