"""Dropout (F.dropout, nn.Dropout, inplace too: aten::dropout and dropout_ reach native_dropout and
native_dropout_backward, one kernel each) with the overrides on. The keep mask comes from the kernels' own
generator, not torch's stream, so it is tested by statistics (keep rate, independence across elements and
calls), by reproducibility under torch.manual_seed, by the Philox4x32-10 it is defined by, and every value
against torch's arithmetic on that mask, bit for bit: input.mul(mask).mul_(1 / (1 - p)) forward, grad * mask
* scale backward. torch's composite keeps what it returns without drawing (p = 0, p = 1, eval, empty) and
its errors."""

import struct

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.autograd import forward_ad

import mps_ext
from conftest import backend, on, ran, to_device

TYPES = [torch.float32, torch.float16, torch.bfloat16]
NAME = {torch.float32: "float", torch.float16: "half", torch.bfloat16: "bfloat"}


def values(shape, dtype=torch.float32, seed=0, nan=False):
    """Values that are never 0 (a dropped element is then told from a kept one by its value), NaN and
    infinities among them where asked."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.rand(shape, generator=g, dtype=torch.float64) + 0.5) * torch.randn(shape, generator=g,
                                                                                   dtype=torch.float64).sign()
    x = (x * 3).to(dtype)
    if nan and x.numel() > 8:
        x.view(-1)[::7] = float("nan")
        x.view(-1)[3::11] = float("-inf")
    return x


def bits(t):
    return t.contiguous().view(torch.uint8) if t.dtype != torch.bool else t.contiguous()


def assert_same(got, want):
    """Same shape, dtype, bytes and NaNs (whose payloads torch's CPU kernels leave to the vector unit)."""
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
    nan = want.isnan() if want.is_floating_point() else torch.zeros_like(want, dtype=torch.bool)
    assert torch.equal(got.isnan() if got.is_floating_point() else nan, nan)
    assert torch.equal(bits(got[~nan]), bits(want[~nan]))


def torchs(x, mask, p):
    """What torch's CPU native_dropout makes of x with this mask: its arithmetic and its rounding."""
    return x.mul(mask).mul_(0.0 if p == 1 else 1 / (1 - p))


def native_dropout(device, x, p, train=True):
    """native_dropout on ``device`` with the overrides on: (output, mask) on the CPU, and the kernels it ran."""
    with mps_ext.overrides.enabled(device), mps_ext.trace() as t:
        out = on(device, lambda v: torch.native_dropout(v, p, train), x)
    return out, t


def dropout(device, x, p, **kwargs):
    with mps_ext.overrides.enabled(device), mps_ext.trace() as t:
        out = on(device, lambda v: F.dropout(v, p, **kwargs), x)
    return out, t


def binomial_bound(n, q, sigmas=6.0):
    return sigmas * (n * q * (1 - q)) ** 0.5


def keep_probability(p):
    """The kernels keep an element iff its 32 random bits are >= ceil(p * 2^32)."""
    return (2**32 - np.ceil(p * 2.0**32)) / 2**32


# ------------------------------------------------------------------------------------------------ statistics

@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
@pytest.mark.parametrize("dtype", TYPES, ids=str)
def test_keep_rate_and_scaling(device, dtype, p):
    x = values((512, 515), dtype, nan=True)
    (out, mask), t = native_dropout(device, x, p)
    ran(t, device, f"dropout_{NAME[dtype]}")
    assert mask.dtype == torch.bool and out.dtype == dtype and out.shape == mask.shape == x.shape
    n, kept = x.numel(), int(mask.sum())
    q = keep_probability(p)
    assert abs(kept - n * q) < binomial_bound(n, q), (kept, n * q)
    assert_same(out, torchs(x, mask, p))
    # Kept values are the input scaled as torch rounds it; dropped ones zeros of the input's sign (NaN
    # and infinities: NaN).
    finite = x.isfinite()
    assert torch.equal(out[mask & finite], (x[mask & finite].float() * (1 / (1 - p))).to(dtype))
    assert torch.equal(out[~mask & finite].abs(), torch.zeros_like(out[~mask & finite]))
    assert out[~mask & ~finite].isnan().all()


def correlation(a, b):
    a, b = a.double() - a.double().mean(), b.double() - b.double().mean()
    return float((a * b).sum() / (a.norm() * b.norm()))


def test_masks_are_independent_across_elements_and_calls(device):
    x = values((1 << 18,))
    (_, first), _ = native_dropout(device, x, 0.5)
    (_, second), _ = native_dropout(device, x, 0.5)
    bound = 6 / x.numel() ** 0.5
    # Neighbours share a Philox block (words of one draw) or sit in the next one; rows of a matrix.
    for lag in (1, 2, 3, 4, 5, 515):
        assert abs(correlation(first[:-lag], first[lag:])) < bound, lag
    assert abs(correlation(first, second)) < bound
    assert not torch.equal(first, second)
    # Runs of kept elements as a fair coin makes them: the mean run length is 2.
    changes = int((first[1:] != first[:-1]).sum())
    assert abs(changes - (x.numel() - 1) / 2) < binomial_bound(x.numel() - 1, 0.5)


def test_manual_seed_reproduces_a_run_bit_for_bit(device):
    x = values((33, 65), torch.float16)
    runs = []
    for seed in (7, 7, 8):
        torch.manual_seed(seed)
        (out, mask), _ = native_dropout(device, x, 0.3)
        out2, _ = dropout(device, x, 0.3)
        runs.append((out, mask, out2))
    (a, ma, a2), (b, mb, b2), (c, mc, c2) = runs
    assert_same(a, b) and assert_same(ma, mb) and assert_same(a2, b2)
    assert not torch.equal(ma, mc)
    assert not torch.equal(a, a2)  # consecutive calls draw keys of their own


def test_torchs_own_random_ops_follow_on_reproducibly(device):
    # Each call takes its key from torch's generator, which moves on: what torch draws next is reproducible,
    # and differs from what it would have drawn without the dropout.
    x = values((100,))
    draws = []
    for dropout_first in (True, True, False):
        torch.manual_seed(3)
        if dropout_first:
            native_dropout(device, x, 0.5)
        draws.append(torch.rand(8, device=device).cpu())
    assert torch.equal(draws[0], draws[1]) and not torch.equal(draws[0], draws[2])


# ----------------------------------------------------------------------------- the generator, as defined

M0, M1, W0, W1 = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85
LOW = np.uint64(0xFFFFFFFF)


def philox(counter, key):
    """Philox4x32-10 of counters (4 arrays of uint32 words) and a key (2 words): 4 arrays of words."""
    c = [np.asarray(w, dtype=np.uint64) for w in counter]
    k0, k1 = np.uint64(key[0]), np.uint64(key[1])
    for r in range(10):
        if r:
            k0, k1 = (k0 + np.uint64(W0)) & LOW, (k1 + np.uint64(W1)) & LOW
        p0, p1 = np.uint64(M0) * c[0], np.uint64(M1) * c[2]
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ k0, p1 & LOW, (p0 >> np.uint64(32)) ^ c[3] ^ k1, p0 & LOW]
    return c


def test_the_reference_philox_gives_random123s_known_answers():
    vectors = [((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
               ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
               ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
                (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1))]
    for counter, key, want in vectors:
        assert tuple(int(w[0]) for w in philox([[w] for w in counter], key)) == want


@pytest.mark.parametrize("p", [0.25, 1 / 3, 1 - 2.0**-33])
def test_the_mask_is_philox_of_the_key_and_each_elements_position(p):
    # The recorded launch carries the key drawn for the call (DropoutParams); element i is kept iff word
    # i % 4 of the block at counter (i / 4, offset) is >= ceil(p * 2^32). Nothing else enters: not the
    # launch's geometry, not the backend.
    x = values((3, 1031))
    with mps_ext.overrides.enabled("cpu"), mps_ext.sim.record_launches() as recording:
        out, mask = torch.native_dropout(x, p, True)
    (launch,) = recording.launches
    assert launch.kernel == "dropout_float"
    numel, seed, offset, threshold, scale, _ = struct.unpack("<4QfI", launch.args[3])
    assert (numel, threshold, scale) == (x.numel(), int(np.ceil(p * 2.0**32)), np.float32(1 / (1 - p)))
    recording.replay()
    quads = np.arange((numel + 3) // 4, dtype=np.uint64)
    words = philox([quads & LOW, quads >> np.uint64(32), [offset & 0xFFFFFFFF] * len(quads), [offset >> 32] * len(quads)],
                   (seed & 0xFFFFFFFF, seed >> 32))
    want = (np.stack(words, 1).reshape(-1)[:numel] >= threshold).reshape(x.shape)
    assert torch.equal(mask, torch.from_numpy(want))
    assert_same(out, torchs(x, mask, p))


# ----------------------------------------------------------------------------------------- F.dropout paths

@pytest.mark.parametrize("dtype", TYPES, ids=str)
def test_f_dropout_and_nn_dropout_run_one_kernel(device, dtype):
    x = values((7, 33), dtype)
    out, t = dropout(device, x, 0.4)
    ran(t, device, f"dropout_{NAME[dtype]}")
    assert_same(out, torchs(x, out != 0, 0.4))
    layer = torch.nn.Dropout(0.4)
    xd = to_device(device, x)
    with mps_ext.overrides.enabled(device), mps_ext.trace() as t:
        trained = layer(xd)
        layer.eval()
        evaluated = layer(xd)
    ran(t, device, f"dropout_{NAME[dtype]}")
    assert evaluated is xd  # torch's eval mode returns the input itself
    assert_same(trained.cpu(), torchs(x, trained.cpu() != 0, 0.4))


@pytest.mark.parametrize("shape", [(), (1,), (3,), (7,), (31,), (33,), (4097,), (2, 3, 5), (2, 1, 3, 4, 5),
                                   (3, 1, 2, 1, 4, 3)], ids=str)
def test_ranks_and_odd_sizes(device, shape):
    # Sizes that end inside a thread's four elements and inside the last threadgroup.
    x = values(shape, torch.float16, seed=len(shape))
    (out, mask), t = native_dropout(device, x, 0.5)
    ran(t, device, "dropout_half")
    assert out.shape == mask.shape == x.shape
    assert_same(out, torchs(x, mask, 0.5))


def views(dtype):
    """Inputs as torch hands them over: sliced at an offset (not aligned for the 4-wide loads), with gaps,
    transposed, channels-last, expanded."""
    base = values((9, 4, 6, 21), dtype, seed=5)
    return {"offset": base.view(-1)[1:1 + 4 * 5 * 7].view(4, 5, 7), "gaps": base[1::2, :, 1:, 3::2],
            "transposed": values((7, 5, 3), dtype).permute(2, 1, 0),
            "channels_last": values((2, 3, 5, 7), dtype).to(memory_format=torch.channels_last),
            "expanded": values((1, 5, 7), dtype).expand(3, 5, 7)}


@pytest.mark.parametrize("dtype", TYPES, ids=str)
def test_views(device, dtype):
    for name, x in views(dtype).items():
        (out, mask), t = native_dropout(device, x, 0.5)
        ran(t, device, f"dropout_{NAME[dtype]}")
        assert_same(out, torchs(x, mask, 0.5))
        want = torch.native_dropout(x, 0.5, True)[0]  # torch's layout: dense inputs keep theirs
        assert out.stride() == want.stride() and mask.stride() == want.stride(), name


def test_p_0_p_1_eval_and_empty_draw_nothing(device):
    # torch's composite: the input itself where nothing is dropped, x * 0 for p = 1 (zeros of the input's
    # sign, NaN for NaN and infinities); no kernel, no key drawn.
    x = to_device(device, values((5, 9), nan=True))
    with mps_ext.overrides.enabled(device), mps_ext.trace() as t:
        assert F.dropout(x, 0.0) is x
        assert F.dropout(x, 0.7, training=False) is x
        empty = x[:0]
        assert F.dropout(empty, 0.7) is empty
        gone = F.dropout(x, 1.0)
        y = x.clone()
        assert F.dropout(y, 1.0, inplace=True) is y
    assert t.names == []
    assert_same(gone.cpu(), x.cpu() * torch.zeros(()))
    assert_same(y.cpu(), gone.cpu())


def test_native_dropout_at_p_0_and_p_1(device):
    x = values((4, 9), nan=True)
    (kept, all_), t = native_dropout(device, x, 0.0)
    (gone, none), _ = native_dropout(device, x, 1.0)
    ran(t, device, "dropout_float")
    assert all_.all() and not none.any()
    assert_same(kept, torchs(x, all_, 0.0))
    assert_same(gone, torchs(x, none, 1.0))


@pytest.mark.fallback("empty input|not training")
def test_native_dropout_in_eval_mode_or_empty_is_torchs(device):
    x = values((4, 9))
    with mps_ext.overrides.enabled(device), mps_ext.trace() as t:
        out, mask = on(device, lambda v: torch.native_dropout(v, 0.5, False), x)
        empty, empty_mask = on(device, lambda v: torch.native_dropout(v, 0.5, True), x[:0])
    assert t.names == []
    assert_same(out, x) and mask.all()
    assert empty.shape == empty_mask.shape == (0, 9)


@pytest.mark.fallback("invalid arguments", required=False)  # F.dropout itself rejects some
@pytest.mark.parametrize("p", [-0.1, 1.5, float("nan")])
def test_a_bad_p_raises_torchs_error(device, p):
    x = values((3, 4))
    calls = [lambda v: F.dropout(v, p), lambda v: F.dropout(v, p, inplace=True), lambda v: torch.dropout(v, p, True),
             lambda v: torch.native_dropout(v, p, True)]
    for call in calls:
        with pytest.raises((RuntimeError, ValueError)) as theirs:
            call(x.clone())
        with mps_ext.overrides.enabled(device), pytest.raises(type(theirs.value)) as ours:
            on(device, call, x.clone())
        if device == "cpu":
            assert str(ours.value) == str(theirs.value)


@pytest.mark.fallback("dtype Double")
def test_other_dtypes_keep_torchs_composite(device):
    if device == "mps":
        pytest.skip("mps has no float64")
    x = values((50, 40), torch.float64)
    torch.manual_seed(1)
    want = F.dropout(x, 0.5)
    torch.manual_seed(1)
    got, t = dropout(device, x, 0.5)
    assert t.names == [] and torch.equal(got, want)  # torch's bernoulli_ stream, bit for bit


# ------------------------------------------------------------------------------------------------- inplace

@pytest.mark.parametrize("dtype", TYPES, ids=str)
def test_inplace_without_autograd_writes_over_the_input_in_one_pass(device, dtype):
    for x in (values((6, 37), dtype), values((2, 3, 5, 7), dtype).to(memory_format=torch.channels_last),
              values((150,), dtype)[1:]):
        x = to_device(device, x.clone())
        before, version = x.cpu().clone(), x._version
        with mps_ext.overrides.enabled(device), mps_ext.trace() as t:
            assert F.dropout(x, 0.3, inplace=True) is x
        ran(t, device, f"dropout_{NAME[dtype]}")
        assert x._version > version  # autograd sees the write
        assert_same(x.cpu(), torchs(before, x.cpu() != 0, 0.3))


def test_inplace_on_a_view_with_gaps(device):
    base = to_device(device, values((6, 10)))
    view, before = base[:, ::2], base.cpu().clone()
    with mps_ext.overrides.enabled(device), mps_ext.trace() as t:
        assert F.dropout(view, 0.5, inplace=True) is view
    assert "dropout_float" in t.names
    after = base.cpu()
    assert torch.equal(after[:, 1::2], before[:, 1::2])  # the elements between stay
    assert_same(after[:, ::2], torchs(before[:, ::2], after[:, ::2] != 0, 0.5))


def test_inplace_under_autograd(device):
    x = to_device(device, values((9, 13))).requires_grad_()
    with mps_ext.overrides.enabled(device), mps_ext.trace() as t:
        y = x * 1
        z = F.dropout(y, 0.5, inplace=True)
        assert z is y
        z.backward(to_device(device, values((9, 13), seed=1)))
    assert "dropout_float" in t.names and "dropout_backward_float" in t.names, t.names
    keep = y.detach().cpu() != 0
    assert_same(x.grad.cpu(), torchs(values((9, 13), seed=1), keep, 0.5))
    with mps_ext.overrides.enabled(device), pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        F.dropout(x, 0.5, inplace=True)


# ------------------------------------------------------------------------------------------------ backward

@pytest.mark.parametrize("dtype", TYPES, ids=str)
def test_backward_is_grad_times_mask_times_scale(device, dtype):
    x = to_device(device, values((31, 67), dtype)).requires_grad_()
    cotangent = values((31, 67), dtype, seed=1, nan=True)
    with mps_ext.overrides.enabled(device), mps_ext.trace() as t:
        y = F.dropout(x, 0.2)
        y.backward(to_device(device, cotangent))
    ran(t, device, f"dropout_{NAME[dtype]}", f"dropout_backward_{NAME[dtype]}")
    assert_same(x.grad.cpu(), torchs(cotangent, y.detach().cpu() != 0, 0.2))


def test_backward_of_strided_gradients(device):
    # The gradient of a sum arrives expanded (stride 0); a transposed one laid out unlike the mask.
    x = to_device(device, values((2, 3, 5, 7))).requires_grad_()
    with mps_ext.overrides.enabled(device), mps_ext.trace() as t:
        y = F.dropout(x, 0.5)
        y.sum().backward(retain_graph=True)
    assert t.names[-1] == "dropout_backward_float", t.names
    keep = y.detach().cpu() != 0
    assert_same(x.grad.cpu(), torchs(torch.ones(2, 3, 5, 7), keep, 0.5))
    cotangent = values((2, 3, 7, 5), seed=2).mT
    x.grad = None
    with mps_ext.overrides.enabled(device):
        y.backward(to_device(device, cotangent))
    assert_same(x.grad.cpu(), torchs(cotangent, keep, 0.5))


def test_backward_of_channels_last_and_empty(device):
    x = to_device(device, values((2, 3, 4, 5)).to(memory_format=torch.channels_last)).requires_grad_()
    with mps_ext.overrides.enabled(device), mps_ext.trace() as t:
        y = F.dropout(x, 0.5)
        y.backward(torch.ones_like(y))
        grad = torch.ops.aten.native_dropout_backward(y[:0], y[:0] != 0, 2.0)
    ran(t, device, "dropout_float", "dropout_backward_float")
    assert_same(x.grad.cpu(), torchs(torch.ones(2, 3, 4, 5), y.detach().cpu() != 0, 0.5))
    assert grad.shape == (0, 3, 4, 5)


@pytest.mark.fallback("mask not bool")
def test_backward_with_another_mask_is_torchs(device):
    grad, mask = values((4, 6)), values((4, 6), seed=1) > 0
    want = torch.ops.aten.native_dropout_backward(grad, mask.float(), 2.0)
    with mps_ext.overrides.enabled(device), mps_ext.trace() as t:
        got = on(device, lambda g, m: torch.ops.aten.native_dropout_backward(g, m, 2.0), grad, mask.float())
    assert t.names == []
    assert_same(got, want)


def test_double_backward_and_forward_mode(device):
    # torch's derivatives of native_dropout: the backward with create_graph (its differentiable formula), its
    # own derivative and the tangent, each mask * scale * v.
    x = to_device(device, values((5, 11))).requires_grad_()
    v = to_device(device, values((5, 11), seed=1)).requires_grad_()
    with mps_ext.overrides.enabled(device):
        y = F.dropout(x, 0.5)
        (g,) = torch.autograd.grad(y, x, v, create_graph=True)
        (gg,) = torch.autograd.grad(g, v, torch.ones_like(g))
    keep = y.detach().cpu() != 0
    assert_same(g.detach().cpu(), torchs(v.detach().cpu(), keep, 0.5))
    assert_same(gg.cpu(), torchs(torch.ones(5, 11), keep, 0.5))
    v = v.detach()
    with mps_ext.overrides.enabled(device), mps_ext.trace() as t, forward_ad.dual_level():
        dual = forward_ad.make_dual(to_device(device, values((5, 11))), v)
        out = F.dropout(dual, 0.5)
        primal, tangent = forward_ad.unpack_dual(out)
    assert "dropout_float" in t.names
    assert_same(tangent.cpu(), torchs(v.cpu(), primal.cpu() != 0, 0.5))


# ---------------------------------------------------------------------------------------------------- rest

def test_checked_mode(device):
    if device != "cpu":
        pytest.skip("the simulator's checks")
    with mps_ext.sim.checked():
        for dtype in TYPES:
            for x in (values((3, 37), dtype), values((300,), dtype)[1:]):  # aligned and not, a partial quad
                x = x.clone().requires_grad_()
                with mps_ext.overrides.enabled("cpu"), mps_ext.trace() as t:
                    y = F.dropout(x, 0.5)
                    y.backward(values(x.shape, dtype, seed=1))
                    z = F.dropout(x.detach().clone(), 0.5, inplace=True)
                ran(t, "cpu", f"dropout_{NAME[dtype]}", f"dropout_backward_{NAME[dtype]}", f"dropout_{NAME[dtype]}")
                assert_same(x.grad, torchs(values(x.shape, dtype, seed=1), y.detach() != 0, 0.5))
                assert z.shape == x.shape


def test_opcheck():
    # Schema (no input written, outputs not aliasing inputs), autograd registration and fake tensors: the
    # checks that hold for a random op (aot_dispatch compares two draws).
    x = values((4, 9)).requires_grad_()
    with mps_ext.overrides.enabled("cpu"):
        torch.library.opcheck(torch.ops.aten.native_dropout.default, (x, 0.5, True),
                              test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))
        torch.library.opcheck(torch.ops.aten.native_dropout_backward.default,
                              (values((4, 9)), values((4, 9), seed=1) > 0, 2.0))


def test_statistics_count_the_kernels(device):
    x = values((8, 8))
    mps_ext.overrides.reset_stats()
    xg = to_device(device, x).requires_grad_()
    with mps_ext.overrides.enabled(device):
        F.dropout(xg, 0.5).sum().backward()
        F.dropout(to_device(device, x.clone()), 0.5, inplace=True)
    stats = mps_ext.overrides.stats()
    assert stats["aten::native_dropout"]["hits"] == 1
    assert stats["aten::native_dropout_backward (backward)"]["hits"] == 1
    assert stats["aten::dropout_"]["hits"] == 1


def test_the_kernels_run_on_the_devices_backend(device):
    with mps_ext.overrides.enabled(device), mps_ext.trace() as t:
        F.dropout(to_device(device, values((64,))), 0.5)
    assert [k.backend for k in t.kernels] == [backend(device)]
