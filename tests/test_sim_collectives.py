"""Every SIMD-group and quad-group function against a Python reference, with
all 32 lanes active and with lanes that returned early (active-lane semantics)."""

import pytest
import torch

WIDTH = 32

# name -> (MSL expression for lane i with value v = x[i] and argument a = arg[i],
#          reference(values, args, active lanes, lane) -> result)
def _reduce(op):
    def ref(v, a, active, lane, width=WIDTH):
        group = [v[j] for j in range(lane - lane % width, lane - lane % width + width) if j in active]
        out = group[0]
        for g in group[1:]:
            out = op(out, g)
        return out
    return ref


def _prefix(op, identity, inclusive):
    def ref(v, a, active, lane, width=WIDTH):
        first = lane - lane % width
        group = [v[j] for j in range(first, lane + (1 if inclusive else 0)) if j in active]
        out = identity
        for g in group:
            out = op(out, g)
        return out
    return ref


def _shuffle(source):
    def ref(v, a, active, lane, width=WIDTH):
        first, pos = lane - lane % width, lane % width
        src = source(pos, a[lane], width)
        return v[first + src] if src is not None and 0 <= src < width and first + src in active else v[lane]
    return ref


def _fill(up):
    def ref(v, a, active, lane, width=WIDTH):
        first, pos, d = lane - lane % width, lane % width, a[lane] % 5  # the kernels pass a % 5
        inside = pos >= d if up else pos + d < width
        src = first + ((pos - d) % width if up else (pos + d) % width)
        if src not in active:
            return v[lane]
        return v[src] if inside else 1000 + v[src]  # `fill` is 1000 + value
    return ref


def _vote(kind):
    def ref(v, a, active, lane, width=WIDTH):
        first = lane - lane % width
        members = [j for j in range(first, first + width) if j in active]
        yes = [j for j in members if v[j] > 0]
        return {"all": float(yes == members), "any": float(bool(yes)), "first": float(lane == members[0]),
                "ballot": float(sum(1 << (j - first) for j in yes))}[kind]
    return ref


add, mul = (lambda x, y: x + y), (lambda x, y: x * y)
CASES = {
    "simd_sum": ("simd_sum(v)", _reduce(add)),
    "simd_product": ("simd_product(v)", _reduce(mul)),
    "simd_max": ("simd_max(v)", _reduce(max)),
    "simd_min": ("simd_min(v)", _reduce(min)),
    "simd_and": ("float(simd_and(uint(v)))", _reduce(lambda x, y: float(int(x) & int(y)))),
    "simd_or": ("float(simd_or(uint(v)))", _reduce(lambda x, y: float(int(x) | int(y)))),
    "simd_xor": ("float(simd_xor(uint(v)))", _reduce(lambda x, y: float(int(x) ^ int(y)))),
    "simd_prefix_inclusive_sum": ("simd_prefix_inclusive_sum(v)", _prefix(add, 0.0, True)),
    "simd_prefix_exclusive_sum": ("simd_prefix_exclusive_sum(v)", _prefix(add, 0.0, False)),
    "simd_prefix_inclusive_product": ("simd_prefix_inclusive_product(v)", _prefix(mul, 1.0, True)),
    "simd_prefix_exclusive_product": ("simd_prefix_exclusive_product(v)", _prefix(mul, 1.0, False)),
    "simd_shuffle": ("simd_shuffle(v, ushort(a))", _shuffle(lambda p, a, w: a)),
    "simd_broadcast": ("simd_broadcast(v, ushort(a % 4))", _shuffle(lambda p, a, w: a % 4)),
    "simd_shuffle_up": ("simd_shuffle_up(v, ushort(a % 5))", _shuffle(lambda p, a, w: p - a % 5)),
    "simd_shuffle_down": ("simd_shuffle_down(v, ushort(a % 5))", _shuffle(lambda p, a, w: p + a % 5)),
    "simd_shuffle_xor": ("simd_shuffle_xor(v, ushort(a % 32))", _shuffle(lambda p, a, w: p ^ (a % 32))),
    "simd_shuffle_rotate_up": ("simd_shuffle_rotate_up(v, ushort(a))", _shuffle(lambda p, a, w: (p - a) % w)),
    "simd_shuffle_rotate_down": ("simd_shuffle_rotate_down(v, ushort(a))", _shuffle(lambda p, a, w: (p + a) % w)),
    "simd_broadcast_first": ("simd_broadcast_first(v)", None),
    "simd_shuffle_and_fill_up": ("simd_shuffle_and_fill_up(v, 1000.0f + v, ushort(a % 5))", _fill(True)),
    "simd_shuffle_and_fill_down": ("simd_shuffle_and_fill_down(v, 1000.0f + v, ushort(a % 5))", _fill(False)),
    "simd_all": ("float(simd_all(v > 0.0f))", _vote("all")),
    "simd_any": ("float(simd_any(v > 0.0f))", _vote("any")),
    "simd_is_first": ("float(simd_is_first())", _vote("first")),
    "simd_ballot": ("float(ulong(simd_ballot(v > 0.0f)))", _vote("ballot")),
    "quad_sum": ("quad_sum(v)", _reduce(add)),
    "quad_max": ("quad_max(v)", _reduce(max)),
    "quad_prefix_exclusive_sum": ("quad_prefix_exclusive_sum(v)", _prefix(add, 0.0, False)),
    "quad_shuffle": ("quad_shuffle(v, ushort(a % 4))", _shuffle(lambda p, a, w: a % 4)),
    "quad_shuffle_xor": ("quad_shuffle_xor(v, ushort(a % 4))", _shuffle(lambda p, a, w: p ^ (a % 4))),
    "quad_shuffle_down": ("quad_shuffle_down(v, ushort(a % 3))", _shuffle(lambda p, a, w: p + a % 3)),
    "quad_broadcast": ("quad_broadcast(v, ushort(a % 4))", _shuffle(lambda p, a, w: a % 4)),
    "quad_any": ("float(quad_any(v > 0.0f))", _vote("any")),
    "quad_all": ("float(quad_all(v > 0.0f))", _vote("all")),
}
QUAD = {name for name in CASES if name.startswith("quad_")}

SOURCE = "#include <metal_stdlib>\nusing namespace metal;\n" + "".join(
    f"""
kernel void k_{name}(device const float* x [[buffer(0)]], device const uint* arg [[buffer(1)]],
                     device float* y [[buffer(2)]], constant uint& active [[buffer(3)]],
                     uint i [[thread_position_in_grid]], uint lane [[thread_index_in_simdgroup]]) {{
  if (lane >= active) return;  // returned lanes leave the active mask, as on the GPU
  const float v = x[i];
  const uint a = arg[i];
  y[i] = {expr};
}}
""" for name, (expr, _) in CASES.items())


@pytest.fixture(scope="module")
def lib(shader):
    return shader(SOURCE, name="collectives")


@pytest.mark.parametrize("active", [32, 13])
@pytest.mark.parametrize("name", sorted(CASES))
def test_collective(lib, name, active):
    g = torch.Generator().manual_seed(len(name) + active)
    n = 64  # two SIMD groups
    # Small integers: sums and products are exact in float, so any order agrees.
    x = torch.randint(-3, 4, (n,), generator=g).float()
    if name in ("simd_product", "simd_prefix_inclusive_product", "simd_prefix_exclusive_product"):
        x = torch.randint(1, 3, (n,), generator=g).float() * torch.where(torch.rand(n, generator=g) < 0.1, -1, 1)
    if name in ("simd_and", "simd_or", "simd_xor"):
        x = torch.randint(0, 256, (n,), generator=g).float()
    arg = torch.randint(0, 40, (n,), generator=g, dtype=torch.int32)
    y = torch.full((n,), float("nan"))
    getattr(lib, f"k_{name}")(x, arg, y, active, arg_casts={3: "int32"}, threads=n, group_size=n)
    lanes = [j for j in range(n) if j % WIDTH < active]
    ref = CASES[name][1]
    width = 4 if name in QUAD else WIDTH
    if ref is None:  # broadcast_first: the first active lane's value
        want = [x[j - j % WIDTH].item() for j in range(n)]
    else:
        want = {j: ref(x.tolist(), arg.tolist(), set(lanes), j, width) for j in lanes}
    for j in range(n):
        if j in lanes:
            assert y[j].item() == pytest.approx(want[j]), f"lane {j}"
        else:
            assert y[j].isnan(), f"lane {j} returned early and must not be written"


def test_vector_and_half_collectives(shader):
    lib = shader("""
#include <metal_stdlib>
using namespace metal;
kernel void k(device const float4* x [[buffer(0)]], device float4* y [[buffer(1)]], device half* h [[buffer(2)]],
              uint i [[thread_position_in_grid]]) {
  y[i] = simd_sum(x[i]) + simd_shuffle_xor(x[i], ushort(1));
  h[i] = simd_max(half(x[i].x));
}""", name="vector_collectives")
    x = torch.randint(-8, 8, (32, 4)).float()
    y, h = torch.empty(32, 4), torch.empty(32, dtype=torch.float16)
    lib.k(x, y, h, threads=32, group_size=32)
    partner = x[torch.arange(32) ^ 1]
    torch.testing.assert_close(y, x.sum(0).expand(32, 4) + partner)
    assert (h == x[:, 0].max().half()).all()
