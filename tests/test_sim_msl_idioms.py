"""MSL as upstream kernels write it (tests/kernels/msl_idioms.metal: what
the ggml and c10/metal files of the corpus rely on; upstream_idioms.metal:
what MLX's own .metal files and other code bases add), on the simulator,
against torch."""

import shlex
import subprocess

import pytest
import torch

import mps_ext
import mps_ext.sim
from mps_ext import testing
from mps_ext.sim import SimulatorError, compiler
from mps_ext.sim.translate import TranslateError, translate


def test_unqualified_as_type_and_integer_select_conditions(kernels):
    lib = kernels("msl_idioms")
    n = 37
    x = torch.linspace(-2, 3, n)
    bits = torch.arange(n, dtype=torch.int32)
    out = torch.full((n, 3), float("nan"))
    with mps_ext.trace() as t, mps_ext.sim.checked():
        lib.idioms(x, bits, out, threads=n)
    assert [(k.name, k.backend) for k in t.kernels] == [("idioms", "simulator")]
    expected = torch.stack([-x, torch.where(bits & 4 != 0, -1.0, 1.0), torch.where(bits & 1 != 0, 0.5, x)], 1)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_make_filled_simdgroup_matrix(kernels):
    lib = kernels("msl_idioms")
    out = torch.zeros(64)
    with mps_ext.sim.checked():
        lib.filled(out, 2.5, threads=32, group_size=32)
    assert torch.equal(out, torch.full((64,), 2.5))


def test_conditionals_convert_as_in_msl(kernels):
    lib = kernels("msl_idioms")
    n = 6
    h = torch.linspace(-3, 5, n).half()
    v = torch.randn(n, 4)
    out = torch.full((n, 8), float("nan"))
    with mps_ext.trace() as t, mps_ext.sim.checked():
        lib.conditionals(h, v, out, threads=n)
    assert [(k.name, k.backend) for k in t.kernels] == [("conditionals", "simulator")]
    i = torch.arange(n)
    odd = i % 2 == 1
    hf, sixteenth = h.float(), (h / 16).float()  # half / half rounds to half
    il = i % 3
    expected = torch.stack([
        torch.where(il < 2, hf, sixteenth), torch.where(il != 0, sixteenth, hf),
        torch.where(odd, hf, 0.0), torch.where(odd, (h * 2).float(), -1.0), torch.where(odd, v[:, 1], 0.5),
        torch.where(odd, hf, torch.where(i == 2, 7.0, (h + 1).float())),
        torch.where(odd, 3.0, -3.0), torch.where(odd, hf, -2.0)], 1)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


BLOCK = """
#include <metal_stdlib>
using namespace metal;
// ggml-common.h's block layout: half inside an anonymous struct inside an anonymous union.
typedef struct { union { struct { half d; half m; }; half2 dm; }; uchar q[4]; } block;
kernel void blocks(device const block* b [[buffer(0)]], device float* out [[buffer(1)]],
                   uint i [[thread_position_in_grid]]) {
  device const block& x = b[i];
  out[2 * i] = x.d * float(x.q[1]) + x.m;
  out[2 * i + 1] = x.dm.y - x.dm.x;
}
"""


def test_half_in_anonymous_struct_of_a_union(shader):
    if "clang" not in subprocess.run([*shlex.split(compiler.toolchain().cxx), "--version"], capture_output=True,
                                     text=True).stdout:
        pytest.skip("GCC rejects a member with constructors in an anonymous struct (a GNU extension)")
    lib = shader(BLOCK)
    n = 9
    dm = torch.randn(n, 2).half()
    q = torch.randint(0, 256, (n, 4), dtype=torch.uint8)
    raw = torch.cat([dm.view(torch.uint8), q], 1).contiguous()  # 8-byte blocks
    out = torch.empty(n, 2)
    with mps_ext.sim.checked():
        lib.blocks(raw, out, threads=n)
    d, m = dm.float().unbind(1)
    half_difference = (dm[:, 1] - dm[:, 0]).float()  # half - half rounds to half
    torch.testing.assert_close(out, torch.stack([d * q[:, 1].float() + m, half_difference], 1), rtol=0, atol=0)


TEMPLATE_ARGUMENT = """
#include <metal_stdlib>
using namespace metal;
template <int N> struct Count { static constant constexpr int value = N; };
template <bool wide, int narrow, int broad>
int pick() { return Count<wide ? broad : narrow>::value; }  // the `>` ends the template arguments
kernel void counts(device int* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  out[i] = i ? pick<true, 2, 8>() : pick<false, 2, 8>();
}
"""


def test_conditional_ending_template_arguments(shader):
    out = torch.zeros(2, dtype=torch.int32)
    with mps_ext.trace() as t:
        shader(TEMPLATE_ARGUMENT).counts(out, threads=2)
    assert t.names == ["counts"]
    assert out.tolist() == [2, 8]


@pytest.mark.parametrize("name, dtype, limit",
                         [("scaled_float", torch.float32, 64), ("scaled_half", torch.float16, 32)])
def test_thread_limit_from_template_parameters(kernels, name, dtype, limit):
    # [[max_total_threads_per_threadgroup(THREADS * 2)]] per instantiation; the body uses the file's own
    # `namespace detail`, assert and a half constant initialized from another.
    kernel = getattr(kernels("upstream_idioms"), name)
    assert kernel.max_threads_per_threadgroup == limit
    n = 77
    x = torch.linspace(-3, 3, n)
    out = torch.full((n,), float("nan"), dtype=dtype)
    with mps_ext.trace() as t, mps_ext.sim.checked():
        kernel(x, out, n, threads=n, arg_casts="int32")
    assert [k.name for k in t.kernels] == [kernel.name]
    testing.assert_close(out, (x * 2).to(dtype) + torch.tensor(2, dtype=dtype), dtype)


def test_failed_assert_names_its_condition(kernels):
    x = torch.zeros(8)
    with pytest.raises(SimulatorError, match=r"assertion failed: i < n.*upstream_idioms.metal:23"):
        kernels("upstream_idioms").scaled_float(x, torch.empty(8), 4, threads=8, arg_casts="int32")


def test_struct_copied_out_of_device_memory(kernels):
    n = 9
    items = torch.randn(n, 8)  # Item: float4 v, float scale, 12 bytes of padding
    out = torch.full((n, 8), float("nan"))
    with mps_ext.trace() as t, mps_ext.sim.checked():
        kernels("upstream_idioms").items(items, out, threads=n)
    assert t.names == ["items"]
    expected = torch.cat([items[:, :4] * items[:, 4:5], items[:, 4:5]], 1)
    testing.assert_close(out[:, :5], expected, torch.float32)


def test_local_struct_through_device_and_threadgroup_memory(kernels):
    n = 24
    cells = torch.randn(n, 2)  # Cell: value, total
    out = torch.full((n, 2), float("nan"))
    with mps_ext.trace() as t, mps_ext.sim.checked():
        kernels("upstream_idioms").local_structs(cells, out, threads=n, group_size=8)
    assert t.names == ["local_structs"]
    partner = torch.arange(n) ^ 1
    expected = torch.stack([cells[partner, 0], cells[partner, 0] + cells[partner, 1]], 1)
    testing.assert_close(out, expected, torch.float32)


def test_constant_half_table_from_floats(kernels):
    out = torch.zeros(6)
    with mps_ext.trace() as t:
        kernels("upstream_idioms").table(out)
    assert t.names == ["table"]
    expected = torch.tensor([0.5, 1.5, float("nan"), -2, 65504, 1e-7]).half().float()  # 1e-7: a half subnormal
    torch.testing.assert_close(out, expected, rtol=0, atol=0, equal_nan=True)


def test_thread_limit_of_a_deduced_instantiation_needs_explicit_arguments(tmp_path):
    path = tmp_path / "deduced.metal"
    path.write_text("#include <metal_stdlib>\nusing namespace metal;\n"
                    "template <typename T>\n"
                    "[[kernel, max_total_threads_per_threadgroup(sizeof(T) * 32)]]\n"
                    "void fill(device T* out [[buffer(0)]]) {\n"
                    "  out[0] = T(1);\n}\n"
                    "template [[host_name(\"fill_float\")]] [[kernel]] void fill(device float* out [[buffer(0)]]);\n")
    with pytest.raises(TranslateError, match=rf"^{path}:8: \[\[max_total_threads_per_threadgroup\(sizeof\(T\)\*32\)"
                                             r"\]\] uses the template parameters T: instantiate the kernel with"):
        translate(path)
