"""The simulator's Metal standard library beyond scalars and vectors: matrix
types, metal::array, as_type, type traits, declval, function-pointer template
parameters, integer arguments of float functions and braced vector
initializers (tests/kernels/msl_library.metal), against torch."""

import torch

import mps_ext.sim


def column_major(m: torch.Tensor) -> torch.Tensor:
    """A matrix as MSL stores it: column after column."""
    return m.T.contiguous().flatten()


def test_matrices(kernels):
    lib = kernels("msl_library")
    n = 4
    g = torch.Generator().manual_seed(0)
    m = torch.randn(4, 4, generator=g)
    d = torch.randn(2, 3, generator=g)   # float3x2: 3 columns of float2
    v = torch.randn(n, 4, generator=g)
    h = torch.randn(4, 4, generator=g).half()
    out = torch.empty(n, 32)
    hm = column_major(h)
    with mps_ext.sim.checked():
        lib.matrices(column_major(m), column_major(d), v, out, hm, threads=n)
    mm = m @ m.T + m
    mh = m.half()
    ones_product = mh[:, 0].clone()
    for c in range(1, 4):
        ones_product = ones_product + mh[:, c]
    expected = torch.cat([
        v @ m.T, v @ m, column_major(mm).expand(n, 16), v[:, :3] @ d.T, v[:, 2:] @ d,
        torch.linalg.det(m).expand(n, 1),
        (torch.linalg.det(m[:3, :3]) - 2).expand(n, 1),
        ones_product.float()[torch.arange(n) % 4].unsqueeze(1),
    ], 1)
    torch.testing.assert_close(out[:, :31], expected[:, :31], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out[:, 31], expected[:, 31], rtol=0, atol=0)
    torch.testing.assert_close(hm, column_major(mh + h), rtol=0, atol=0)


def test_array_as_type_traits_and_overloads(kernels):
    lib = kernels("msl_library")
    n = 37
    x = torch.linspace(-3, 3, n)
    out = torch.empty(n, 8)
    bits = torch.empty(n, dtype=torch.int32)
    with mps_ext.sim.checked():
        lib.library(x, out, bits, threads=n)
    i = torch.arange(n, dtype=torch.float32)
    expected = torch.stack([
        13 * x + 3, 2 ** x + x.clamp(min=0) + x.clamp(max=1), x * x - x, 2 * x + 2 * i, -x,
        torch.full((n,), 6.0), x.half().float(), torch.full((n,), 65504.0),
    ], 1)
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-5)
    assert torch.equal(bits, x.view(torch.int32))
