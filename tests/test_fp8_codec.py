"""The e4m3fn codec of metal/include/mps_ext/fp8.h, run in the simulator through
a test kernel, against torch's CPU conversions: all 256 codes, every rounding
boundary, saturation, NaN and random bit patterns."""

import math
from pathlib import Path

import pytest
import torch

import mps_ext.sim

ROOT = Path(__file__).resolve().parent.parent
F8 = torch.float8_e4m3fn


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.fixture(scope="module")
def codec():
    return mps_ext.sim.compile_file(ROOT / "tests" / "kernels" / "fp8_codec.metal",
                                    include_dirs=[ROOT / "metal" / "include"])


ALL_CODES = torch.arange(256, dtype=torch.uint8)


def test_decode_all_256_codes_bit_exact(codec):
    out = torch.empty(256)
    codec.decode(ALL_CODES, out)
    want = ALL_CODES.view(F8).float()
    assert torch.equal(out.view(torch.int32), want.view(torch.int32))  # NaN bits and -0 included


def decode_fast(codec, words: torch.Tensor):
    """The float and half decodes of 4-byte words, scaled back, with the flags of their NaN codes."""
    n = words.shape[0]
    out, out_half = torch.empty(n, 4), torch.empty(n, 4)
    nan_flags = torch.empty(n, dtype=torch.int32)
    codec.decode_fast(words.contiguous().view(torch.int32).flatten(), out, out_half, nan_flags)
    return out, out_half, nan_flags.view(torch.uint8).view(n, 4)


def test_fast_decode_all_256_codes(codec):
    out, out_half, flags = decode_fast(codec, ALL_CODES.view(64, 4))
    want = ALL_CODES.view(F8).float().view(64, 4)
    nan = want.isnan()
    assert torch.equal(out.isnan(), nan)
    assert torch.equal(out[~nan], want[~nan]) and torch.equal(out.signbit()[~nan], want.signbit()[~nan])
    # The half decode is exact for every code but NaN, the 14 subnormal codes included (through half
    # subnormals, which the simulator keeps as Apple's GPUs do), and the flags take exactly the NaN codes.
    assert torch.equal(out_half[~nan], want[~nan]) and torch.equal(out_half.signbit(), want.signbit())
    assert not out_half.isnan().any()
    assert torch.equal(flags == 0x80, nan) and not (flags & 0x7F).any()
    # The flags on words mixing NaN codes with every other code (no carry between bytes): 0x7E, the largest
    # finite code, is one below NaN.
    words = torch.randint(0, 256, (4096, 4), generator=gen(1), dtype=torch.uint8)
    words[::3, 1] = 0x7F
    words[::5, 3] = 0xFF
    words[::7, 2] = 0x7E
    words[::11, 0] = 0xFE
    _, _, flags = decode_fast(codec, words)
    assert torch.equal(flags == 0x80, words.view(F8).float().isnan()) and not (flags & 0x7F).any()


def test_a_gpu_that_flushes_half_denormals_loses_only_the_half_decodes_subnormal_codes(codec):
    want = ALL_CODES.view(F8).float().view(64, 4)
    codes = ALL_CODES.view(64, 4)
    subnormal = ((codes & 0x78) == 0) & ((codes & 0x07) != 0)
    with mps_ext.sim.flush_half_subnormals():
        out, out_half, _ = decode_fast(codec, codes)
    nan = want.isnan()
    assert torch.equal(out[~nan], want[~nan]) and torch.equal(out.signbit()[~nan], want.signbit()[~nan])
    # Through halves, each subnormal code becomes the zero of its sign; every other code stays exact.
    assert torch.equal(out_half[subnormal], torch.zeros(14)) and torch.equal(out_half.signbit(), want.signbit())
    exact = ~nan & ~subnormal
    assert torch.equal(out_half[exact], want[exact])
    _, out_half, _ = decode_fast(codec, codes)  # the setting ends with the block
    assert torch.equal(out_half[subnormal], want[subnormal])


def encode_cases() -> torch.Tensor:
    finite = ALL_CODES.view(F8).float()
    finite = finite[~finite.isnan()].double().unique()
    mid = (finite[1:] + finite[:-1]) / 2  # every rounding boundary (ties, exact in float32)
    mid = mid.float()
    up, down = torch.nextafter(mid, torch.tensor(math.inf)), torch.nextafter(mid, torch.tensor(-math.inf))
    special = torch.tensor([0.0, -0.0, math.inf, -math.inf, math.nan, -math.nan, 448.0, 449.0, 463.99, 464.0, 464.01,
                            479.0, 480.0, 481.0, 1e4, 3.4e38, 2.0**-9, 2.0**-10, 2.0**-11, 1e-30, 1e-40, 1.4e-45,
                            2.0**-6, 2.0**-6 - 2.0**-10, 2.0**-6 - 2.0**-11])
    rand_bits = torch.randint(-2**31, 2**31 - 1, (200000,), generator=gen(2), dtype=torch.int64).to(torch.int32)
    values = torch.cat([finite.float(), mid, up, down, special, rand_bits.view(torch.float32),
                        torch.randn(20000, generator=gen(3)) * 100])
    return torch.cat([values, -values])


def test_encode_matches_torch_on_every_boundary(codec):
    values = encode_cases()
    out = torch.empty(values.numel(), dtype=torch.uint8)
    codec.encode(values, out)
    want = values.to(F8).view(torch.uint8)
    bad = out != want
    assert not bad.any(), f"{values[bad][:8].tolist()} -> {out[bad][:8].tolist()}, torch {want[bad][:8].tolist()}"
    # torch saturates: everything >= 448 (and inf) is +-448, NaN keeps its sign.
    assert out[values.isinf()].tolist().count(0x7E) + out[values.isinf()].tolist().count(0xFE) == int(values.isinf().sum())
