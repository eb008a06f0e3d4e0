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


def test_static_threadgroup_memory_length_as_metal_counts_it(shader):
    # Each variable at its alignment, in declaration order, the total rounded up to 16 bytes; array sizes may
    # use template parameters and the kernel's constexpr locals.
    lib = shader(HEADER + """
template <typename T, uint N>
kernel void k(device T* y [[buffer(0)]], uint i [[thread_index_in_threadgroup]]) {
  constexpr uint M = N * 2;
  threadgroup char c[3];
  threadgroup T a[M], b;
  c[i % 3] = 1;
  a[i % M] = y[i];
  b = y[i];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  y[i] = a[(i + 1) % M] + b + T(c[0]);
}
template [[host_name("k_float4_8")]] kernel void k<float4, 8>(device float4*, uint);
template [[host_name("k_half_1")]] kernel void k<half, 1>(device half*, uint);
kernel void none(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) { y[i] = 0; }""",
                 name="threadgroup_sizes")
    assert lib.k_float4_8.static_thread_group_memory_length == 16 + 16 * 16 + 16  # c padded to a's 16 bytes
    assert lib.k_half_1.static_thread_group_memory_length == 16  # 3 + 1 + 2 * 2 + 2 = 10
    assert lib.none.static_thread_group_memory_length == 0


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


@pytest.mark.parametrize("attribute", ["[[texture(0)]]", "[[stage_in]]"])
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
    built = first.stat().st_ino  # a build renames a new file into place (loading marks the old one used)
    assert compiler.compile_source(source, "cached") == first
    assert first.stat().st_ino == built, "an unchanged source is not compiled again"
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


# -- malformed sources: always a CompileError with a .metal position, never a hang or a Python crash

MALFORMED = {
    "kernel without a body": "kernel void f(device float* x [[buffer(0)]])",
    "template without ';'": "template foo",
    "instantiation without ';'": 'template <typename T> kernel void f(device T* x [[buffer(0)]]) {}\n'
                                 'template [[host_name("f")]] kernel void f<float>(device float* x [[buffer(0)]])',
    "threadgroup declaration without ';'": "kernel void f(device float* x [[buffer(0)]]) {\n  threadgroup float t[4]\n}",
    "namespace at the end": "namespace foo",
    "non-literal buffer index": "kernel void f(device float* x [[buffer(a)]]) {}",
    "buffer index past the slots": "kernel void f(device float* x [[buffer(31)]]) {}",
    "70 buffer parameters": "kernel void f(" + ", ".join(f"device float* b{n}" for n in range(70)) + ") {}",
    "unbalanced attribute": "kernel void f(device float* x [[buffer(0)) {}",
    "kernel without parameters list": "kernel void",
    "function constant without ';'": "constant bool c [[function_constant(0)]]",
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_sources_are_compile_errors_with_a_position(shader, case):
    with pytest.raises(CompileError, match=r"\.metal:\d+: "):
        shader(HEADER + MALFORMED[case] + "\n", name="malformed")


def test_truncated_real_kernels_never_crash_or_hang(tmp_path):
    # Every prefix (sampled) of the package's own and the test kernels, at token boundaries.
    import signal
    from pathlib import Path

    from mps_ext.sim.translate import TranslateError, _tokenize, preprocess, translate_text

    root = Path(__file__).resolve().parent.parent
    sources = [root / "metal" / "softmax.metal", *sorted((root / "tests" / "kernels").glob("*.metal"))]

    def timeout(*_):
        raise TimeoutError("the translator did not finish within 5 s")

    previous = signal.signal(signal.SIGALRM, timeout)
    try:
        for source in sources:
            text = preprocess(source, [root / "metal" / "include"])
            lines = text.split("\n")
            for cut in range(0, len(lines), max(1, len(lines) // 60)):
                truncated = "\n".join(lines[:cut])
                # Also cut inside a line: half of the next line's tokens.
                for extra in ("", " ".join(t.text for t in _tokenize(lines[cut] if cut < len(lines) else "")[:3])):
                    signal.alarm(5)
                    try:
                        translate_text(truncated + "\n" + extra)
                    except TranslateError as e:
                        assert re.match(r".+:\d+: ", str(e)), str(e)
                    finally:
                        signal.alarm(0)
    finally:
        signal.signal(signal.SIGALRM, previous)


# -- coverage of real Metal code

def test_apple_predefined_macros_and_metal_func(shader):
    lib = shader(HEADER + """
#if !defined(__METAL__) || !defined(__METAL_MACOS__) || !defined(__HAVE_BFLOAT__) || __METAL_VERSION__ < 310
#error not Apple's predefined macros
#endif
METAL_FUNC float twice(float x) { return 2 * x; }
kernel void k(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) { out[i] = twice(float(i)); }
""", name="predefined")
    out = torch.zeros(3)
    lib.k(out)
    assert out.tolist() == [0.0, 2.0, 4.0]


def test_every_explicit_instantiation_form(shader):
    lib = shader(HEADER + """
template <typename T>
[[kernel]] void fill(device T* out [[buffer(0)]], constant T& v [[buffer(1)]], uint i [[thread_position_in_grid]]) {
  out[i] = v + T(i);
}
typedef decltype(fill<float>) fill_t;
template [[host_name("fill_typedef")]] kernel fill_t fill<float>;
template [[host_name("fill_decltype")]] [[kernel]] decltype(fill<int>) fill<int>;
template [[host_name("fill_explicit")]] kernel void fill<float>(device float*, constant float&, uint);
template [[host_name("fill_deduced")]] kernel void fill(device int* out, constant int& v, uint i);
""", name="instantiations")
    assert dir(lib) == ["fill_decltype", "fill_deduced", "fill_explicit", "fill_typedef"]
    for name, dtype, value in [("fill_typedef", torch.float32, 1.5), ("fill_decltype", torch.int32, 7),
                               ("fill_explicit", torch.float32, 2.5), ("fill_deduced", torch.int32, 3)]:
        out = torch.zeros(4, dtype=dtype)
        getattr(lib, name)(out, value, arg_casts="int32" if dtype == torch.int32 else None)
        assert out.tolist() == [value + n for n in range(4)], name


def test_static_constant_constexpr_const_and_coherence_keywords(shader):
    lib = shader(HEADER + """
static constant constexpr const int kTwo = 2;
struct Tile { static constant constexpr const short kRows = 3; };
kernel void k(coherent(device) device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  out[i] = float(kTwo * Tile::kRows);
}""", name="specifiers", msl_version="3.2")
    out = torch.zeros(2)
    lib.k(out)
    assert out.tolist() == [6.0, 6.0]


def test_name_lookup_is_msl_s(shader):
    # A user's overload of a metal function joins metal's overload set instead of hiding it, and a
    # user's `namespace metal` extends the real one.
    lib = shader(HEADER + """
float fract(float x, float scale) { return metal::fract(x) * scale; }
namespace metal { float twice(float x) { return 2 * x; } }
kernel void k(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  out[i] = fract(1.25f) + fract(1.25f, 4.0f) + metal::twice(1.0f) + metal::abs(-1.0f);
}""", name="lookup")
    out = torch.zeros(1)
    lib.k(out)
    assert out.tolist() == [0.25 + 1.0 + 2.0 + 1.0]


FUNCTION_CONSTANTS = HEADER + """
constant float scale [[function_constant(0)]];
constant bool has_bias [[function_constant(1)]];
constant bool no_bias = !is_function_constant_defined(has_bias) || !has_bias;
kernel void k(device float* out [[buffer(0)]], device const float* bias [[buffer(1), function_constant(has_bias)]],
              uint i [[thread_position_in_grid]]) {
  out[i] = float(i) * (is_function_constant_defined(scale) ? scale : 1.0f) + (no_bias ? 0.0f : bias[i]);
}"""


def test_function_constants(shader):
    x = torch.arange(4.0)
    bias = torch.full((4,), 10.0)
    with_bias = shader(FUNCTION_CONSTANTS, name="constants", constants={0: 2.5, "has_bias": True})
    out = torch.zeros(4)
    with_bias.k(out, bias)
    assert out.tolist() == (x * 2.5 + 10).tolist()
    plain = shader(FUNCTION_CONSTANTS, name="constants")  # no values: constants undefined
    plain.k(out, bias)
    assert out.tolist() == x.tolist()
    assert plain.path != with_bias.path, "each set of values is its own module"
    assert shader(FUNCTION_CONSTANTS, name="constants", constants={0: 2.5, "has_bias": True}).path == with_bias.path


def test_function_constant_values_must_match_declarations(shader):
    with pytest.raises(CompileError, match="match no \\[\\[function_constant\\]\\].*declared: has_bias, scale"):
        shader(FUNCTION_CONSTANTS, name="constants", constants={"scael": 1.0})


def test_user_namespace_metal_extends_the_real_one_inside_the_extension(tmp_path):
    # Kernels built into the extension keep internal linkage (an unnamed namespace); a user's
    # `namespace metal` there must still extend ::metal.
    src = tmp_path / "ext.metal"
    src.write_text(HEADER + "namespace metal { inline float twice(float x) { return 2 * x; } }\n"
                            "kernel void k(device float* x [[buffer(0)]]) { x[0] = metal::twice(x[0]); }\n")
    cpp = translate(src, standalone=False).cpp
    assert "} namespace metal {" in cpp and "} namespace {" in cpp
    assert "} namespace metal {" not in translate(src).cpp  # separate modules stand at global scope already


def test_function_constant_declared_static_constexpr(shader):
    """MLX's fft.h: `static constant constexpr const int n [[function_constant(2)]];`."""
    lib = shader(HEADER + """
static constant constexpr const int n_ [[function_constant(2)]];
kernel void k(device int* out [[buffer(0)]]) { out[0] = n_ + 1; }""", name="static_constant", constants={2: 41})
    out = torch.zeros(1, dtype=torch.int32)
    lib.k(out)
    assert out.item() == 42
