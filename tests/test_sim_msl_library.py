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


# The metal_stdlib internals that MLX's bf16_math.h and atomic.h call (mtlsim/internals.h).
INTERNALS = """#include <metal_stdlib>
using namespace metal;
#pragma METAL internals : enable
template <typename T> constexpr constant bool is_small = _disjunction<is_same<T, half>, is_same<T, bfloat>>::value;
#pragma METAL internals : disable
kernel void internals(device const float* x [[buffer(0)]], device float* out [[buffer(1)]],
                      uint i [[thread_position_in_grid]]) {
  const float v = x[i];
  constexpr metal::remove_addrspace_t<constant const int> three = 3;
  out[i * 8 + 0] = __metal_fabs(v, __METAL_MAYBE_FAST_MATH__) + __metal_fmax3(v, 0.5f, -v, __METAL_FAST_MATH__);
  out[i * 8 + 1] = __metal_pow(2.0f, v, __METAL_PRECISE_MATH__) + __metal_fma(v, v, 1.0f);
  int e;
  out[i * 8 + 2] = __metal_frexp(v, &e) + e + __metal_ldexp(v, three, __METAL_FAST_MATH__);
  out[i * 8 + 3] = __metal_simd_sum(v) + __metal_simd_max(v);
  out[i * 8 + 4] = __metal_simd_shuffle_xor(v, ushort(1)) + __metal_simd_broadcast(v, ushort(3));
  out[i * 8 + 5] = __metal_simd_shuffle_and_fill_down(v, -v, ushort(2), __metal_get_simdgroup_size(ushort()));
  out[i * 8 + 6] = as_type<float>(as_type<uint>(__metal_simd_xor(v)) ^ as_type<uint>(v));
  out[i * 8 + 7] = float(is_small<half>) + float(is_small<float>) * 2 + __metal_simd_prefix_exclusive_sum(1.0f);
}
"""


def test_metal_stdlib_internals():
    lib = mps_ext.sim.compile_shader(INTERNALS, name="internals")
    x = torch.linspace(-3, 4, 32)
    out = torch.empty(32, 8)
    with mps_ext.sim.checked():
        lib.internals(x, out, threads=32, group_size=32)
    lane = torch.arange(32)
    m, e = torch.frexp(x)
    fill = torch.where(lane + 2 < 32, x[(lane + 2) % 32], -x[(lane + 2) % 32])
    xor_all = torch.tensor(0, dtype=torch.int32)
    for bits in x.view(torch.int32):
        xor_all ^= bits
    xor_others = (xor_all ^ x.view(torch.int32)).view(torch.float32)
    expected = torch.stack([
        x.abs() + torch.maximum(torch.maximum(x, torch.tensor(0.5)), -x), 2 ** x + x * x + 1,
        m + e + x * 8, x.sum().expand(32) + x.max(), x[lane ^ 1] + x[3], fill, xor_others, 1 + lane.float(),
    ], 1)
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-5)


def test_uniform_values():
    lib = mps_ext.sim.compile_shader("""#include <metal_stdlib>
using namespace metal;
kernel void k(device int* out [[buffer(0)]], constant int& n [[buffer(1)]], uint i [[thread_position_in_grid]]) {
  constexpr const uniform<int> step = make_uniform(4);
  const uniform<int> size = make_uniform(n);
  const uniform<int> rounds = size / step;
  const uniform<int> left = size - step * rounds;
  int s = 0;
  for (int r = 0; r < rounds; ++r) s += step;
  out[i] = s * 100 + left + int(i);
}
""", name="uniform")
    out = torch.zeros(3, dtype=torch.int32)
    lib.k(out, 11, arg_casts="int32", threads=3)
    assert out.tolist() == [803, 804, 805]


def test_user_type_traits_in_namespace_metal():
    """MSL 3.1's <metal_type_traits> has no is_empty or void_t: MLX's steel/utils/type_traits.h defines them
    in namespace metal, which must not collide with the shim's."""
    lib = mps_ext.sim.compile_shader("""#include <metal_stdlib>
namespace metal {
template <typename T> struct is_empty : metal::bool_constant<__is_empty(T)> {};
template <typename... Ts> struct make_void { typedef void type; };
template <typename... Ts> using void_t = typename make_void<Ts...>::type;
}
using namespace metal;
struct none {};
template <typename T, typename = void> struct has_x : false_type {};
template <typename T> struct has_x<T, void_t<decltype(T::x)>> : true_type {};
struct with_x { static constexpr constant int x = 1; };
kernel void k(device int* out [[buffer(0)]]) {
  out[0] = is_empty<none>::value + 2 * is_empty<with_x>::value + 4 * has_x<with_x>::value + 8 * has_x<none>::value;
}
""", name="user_type_traits")
    out = torch.zeros(1, dtype=torch.int32)
    lib.k(out, threads=1)
    assert out.item() == 1 + 2 + 4
