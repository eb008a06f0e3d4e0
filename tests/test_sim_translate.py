"""The .metal -> C++ translation: what it rewrites, what it keeps, and how its
errors point at .metal lines."""

import re

import pytest
import torch

from mps_ext.sim import CompileError
from mps_ext.sim.translate import translate

HEADER = "#include <metal_stdlib>\nusing namespace metal;\n"


def test_compile_errors_name_the_metal_line(shader):
    source = HEADER + "kernel void k(device float* x [[buffer(0)]], uint i [[thread_position_in_grid]]) {\n" \
                      "  x[i] = undefined_name;\n}\n"
    with pytest.raises(CompileError, match=r"\.metal:4:.*undefined_name"):
        shader(source, name="broken")


def test_literals_and_address_spaces(shader):
    lib = shader(HEADER + """
constant float kScale = 0.5;              // unsuffixed: float in MSL
constant constexpr half kHalf = 1.5h;     // half literal
constant const int kTable[3] = {1, 2, 3};
kernel void k(device float* out [[buffer(0)]], device half* h [[buffer(1)]],
              constant float* table [[buffer(2)]], uint i [[thread_position_in_grid]]) {
  thread float local = kScale * float(i) + 1e-1;
  device float* p = out + i;
  *p = local + float(kTable[i % 3]) + table[0];
  h[i] = kHalf * half(i) + 0.25h;
}""", name="literals")
    out, h = torch.empty(6), torch.empty(6, dtype=torch.float16)
    lib.k(out, h, torch.tensor([10.0]))
    i = torch.arange(6, dtype=torch.float32)
    torch.testing.assert_close(out, 0.5 * i + 0.1 + torch.tensor([1.0, 2, 3, 1, 2, 3]) + 10)
    torch.testing.assert_close(h, (1.5 * i + 0.25).half())


def test_instantiation_forms_namespaces_and_macros(shader):
    lib = shader(HEADER + """
#define STR(x) #x
#if __METAL_VERSION__ >= 310
#define OFFSET 1
#endif
namespace ops {
struct Add { template <typename T> static T apply(T a) { return a + T(OFFSET); } };
template <typename T, typename Op, int Scale>
kernel void unary(device const T* x [[buffer(0)]], device T* y [[buffer(1)]], uint i [[thread_position_in_grid]]) {
  y[i] = Op::apply(x[i]) * T(Scale);
}
template [[host_name("add_" STR(float) "_x2")]] kernel void unary<float, Add, 2>(
    device const float* x [[buffer(0)]], device float* y [[buffer(1)]], uint i [[thread_position_in_grid]]);
template [[host_name("add_int_x3")]] [[kernel]] decltype(unary<int, Add, 3>) unary<int, Add, 3>;
}  // namespace ops
[[host_name("renamed")]] kernel void plain(device int* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  y[i] = int(i);
}""", name="forms")
    assert dir(lib) == ["add_float_x2", "add_int_x3", "renamed"]
    x = torch.arange(5, dtype=torch.float32)
    y = torch.empty_like(x)
    lib.add_float_x2(x, y)
    assert torch.equal(y, (x + 1) * 2)
    xi, yi = torch.arange(5, dtype=torch.int32), torch.empty(5, dtype=torch.int32)
    lib.add_int_x3(xi, yi)
    assert torch.equal(yi, (xi + 1) * 3)
    lib.renamed(yi)
    assert yi.tolist() == list(range(5))


def test_implicit_buffer_indices_follow_metal(shader):
    # Unattributed buffers take the lowest free index, in order, as Metal assigns them.
    lib = shader(HEADER + """
kernel void k(device float* a, device float* b [[buffer(0)]], constant float& s,
              uint i [[thread_position_in_grid]]) { a[i] = b[i] * s; }""", name="implicit")
    b, a = torch.arange(4.0), torch.zeros(4)
    lib.k(b, a, 3.0)  # buffer(0) = b, buffer(1) = a, buffer(2) = s
    assert a.tolist() == [0.0, 3.0, 6.0, 9.0]


def test_threadgroup_declarations(tmp_path):
    src = tmp_path / "tg.metal"
    src.write_text(HEADER + """
kernel void k(threadgroup float* dyn [[threadgroup(0)]], uint t [[thread_position_in_threadgroup]]) {
  threadgroup float a[4][8], b;
  threadgroup float* p = a[0];
  threadgroup vec<float, 4> c[2];
  p[t] = dyn[t] + b + c[0].x;
}""")
    tr = translate(src)
    assert tr.threadgroup_sites == 3
    assert re.search(r"threadgroup float \( & a \) \[ 4 \] \[ 8 \] = :: mtlsim :: threadgroup_var < threadgroup float "
                     r"\[ 4 \] \[ 8 \] >", tr.cpp)
    assert re.search(r"threadgroup float \( & b \) = :: mtlsim :: threadgroup_var < threadgroup float >", tr.cpp)
    assert re.search(r"\bfloat \* p = a \[ 0 \]", tr.cpp)  # a pointer: thread-private
    assert "::mtlsim::ThreadgroupArg<0>" in tr.cpp.replace(" ", "")


def test_line_directives_keep_metal_lines(tmp_path):
    src = tmp_path / "lines.metal"
    src.write_text(HEADER + "\n" * 20 + "kernel void k(device float* x [[buffer(0)]]) { x[0] = 1.0; }\n")
    tr = translate(src)
    assert f'#line 23 "{src}"' in tr.cpp
    assert [(k.host_name, k.line) for k in tr.kernels] == [("k", 23)]


@pytest.mark.parametrize("attribute", ["[[function_constant(0)]]", "[[stage_in]]"])
def test_unsupported_attributes_are_errors(shader, attribute):
    with pytest.raises(CompileError, match=re.escape(attribute[2:].split("(")[0].rstrip("]"))):
        shader(HEADER + f"kernel void k(device float* x [[buffer(0)]], bool flag {attribute}) {{}}", name="unsupported")


def test_instantiation_without_host_name_is_an_error(shader):
    with pytest.raises(CompileError, match="host_name"):
        shader(HEADER + "template <typename T> kernel void k(device T* x [[buffer(0)]]) {}\n"
                        "template kernel void k<float>(device float* x [[buffer(0)]]);", name="nohost")


def test_no_kernels_is_an_error(shader):
    with pytest.raises(CompileError, match="no kernel"):
        shader(HEADER + "inline float f(float x) { return x; }", name="empty")


def test_compiled_modules_are_cached_by_content(tmp_path, monkeypatch):
    from mps_ext.sim import compiler

    monkeypatch.setenv("MPS_EXT_CACHE_DIR", str(tmp_path))
    source = HEADER + "kernel void k(device float* x [[buffer(0)]]) { x[0] = 1.0f; }\n"
    first = compiler.compile_source(source, "cached")
    built = first.stat().st_mtime_ns
    assert compiler.compile_source(source, "cached") == first
    assert first.stat().st_mtime_ns == built, "an unchanged source is not compiled again"
    other = compiler.compile_source(source.replace("1.0f", "2.0f"), "cached")
    assert other != first and str(other).startswith(str(tmp_path))


def test_position_attributes_must_agree_in_components(shader):
    # Metal rejects a kernel whose grid/threadgroup position attributes mix
    # component counts; the simulator must not accept what the GPU compiler refuses.
    with pytest.raises(CompileError, match=r"same number of components.*threadgroup_position_in_grid\]\] with 2.*"
                                           r"thread_position_in_threadgroup\]\] with 1"):
        shader(HEADER + "kernel void k(device float* x [[buffer(0)]], uint2 g [[threadgroup_position_in_grid]],\n"
                        "              uint t [[thread_position_in_threadgroup]]) { x[g.x] = float(t); }",
               name="mixed_positions")
    # Other attributes (indices, SIMD lanes) are free to differ.
    shader(HEADER + "kernel void k(device float* x [[buffer(0)]], uint2 g [[threadgroup_position_in_grid]],\n"
                    "              ushort2 t [[thread_position_in_threadgroup]], uint i [[thread_index_in_threadgroup]],\n"
                    "              ushort lane [[thread_index_in_simdgroup]]) { x[g.x] = float(t.x + i + lane); }",
           name="agreeing_positions")


def test_threadgroup_declaration_after_an_attribute_is_shared(shader):
    lib = shader(HEADER + """
kernel void k(device float* y [[buffer(0)]], uint t [[thread_position_in_threadgroup]]) {
  [[maybe_unused]] threadgroup float s[64];
  s[t] = float(t);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  y[t] = s[63 - t];
}""", name="attributed_threadgroup")
    y = torch.zeros(64)
    lib.k(y, group_size=64)
    assert y.tolist() == [float(63 - t) for t in range(64)]
