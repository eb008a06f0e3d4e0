"""MSL's own language rules, enforced by the translator: each planted violation
fails naming its rule and .metal line, and its valid twin is accepted (the
twins are then compiled and run together, so the accepted side is real MSL
the simulator runs, not only text the checker lets through)."""

import re

import pytest
import torch

import mps_ext
from mps_ext.sim import CompileError
from mps_ext.sim.translate import TranslateError, translate

HEADER = "#include <metal_stdlib>\nusing namespace metal;\n"
KERNEL = "kernel void k(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {{\n{body}\n}}\n"

# case -> (rule named in the error, invalid source, valid twin).
CASES = {
    "double": ("no double", KERNEL.format(body="  double x = out[i];\n  out[i] = float(x);"),
               "// double precision is not needed here: \"double\"\n" +
               KERNEL.format(body="  float double_it = float(i + 1) * 2.0;  // not a double\n  out[i] = double_it;")),
    "long double": ("no double", KERNEL.format(body="  long double x = 1;\n  out[i] = float(x);"),
                    KERNEL.format(body="  long x = 1;\n  out[i] = float(x);")),
    "new": ("no dynamic allocation", KERNEL.format(body="  thread float* p = new float[4];\n  out[i] = p[0];"),
            KERNEL.format(body="  float renew[4] = {1, 2, 3, 4};\n  out[i] = renew[i % 4];")),
    "delete": ("no dynamic allocation", KERNEL.format(body="  thread float* p = out;\n  delete p;"),
               "struct NoCopy { float v; void set(int) = delete; void set(float x) { v = x; } };\n" +
               KERNEL.format(body="  NoCopy c;\n  c.set(float(i + 1));\n  out[i] = c.v;")),
    "try": ("no exceptions", KERNEL.format(body="  try { out[i] = 1.0f; } catch (...) { out[i] = 0.0f; }"),
            KERNEL.format(body="  { out[i] = 1.0f; }")),
    "throw": ("no exceptions", KERNEL.format(body="  if (out[i] < 0) throw 1;"),
              KERNEL.format(body="  if (out[i] < 0) return;\n  out[i] = 1;")),
    "virtual": ("no virtual functions",
                "struct Base {\n  virtual float f() const { return 1.0f; }\n};\n" + KERNEL.format(body="  out[i] = 1;"),
                "struct Base { float f() const { return 1.0f; } };\nstruct Derived : Base {};\n" +
                KERNEL.format(body="  Derived d;\n  out[i] = d.f();")),
    "typeid": ("no RTTI", KERNEL.format(body="  out[i] = float(sizeof(typeid(float)));"),
               KERNEL.format(body="  out[i] = float(sizeof(float));")),
    "dynamic_cast": ("no RTTI", "struct A {};\n" + KERNEL.format(body="  A a;\n  thread A* p = dynamic_cast<thread A*>(&a);"),
                     "struct A {};\n" + KERNEL.format(body="  A a;\n  thread A* p = static_cast<thread A*>(&a);\n"
                                                           "  out[i] = p ? 1.0f : 0.0f;")),
    "goto": ("no goto", KERNEL.format(body="  goto done;\n  out[i] = 1;\ndone:\n  return;"),
             KERNEL.format(body="  switch (i % 2) {\n  case 0: out[i] = 1; break;\n  default: out[i] = 2;\n  }")),
    "thread_local": ("no thread_local", KERNEL.format(body="  thread_local float x = 1;\n  out[i] = x;"),
                     KERNEL.format(body="  thread float x = 1;\n  out[i] = x;")),
    "register": ("no register", KERNEL.format(body="  register float x = 1;\n  out[i] = x;"),
                 KERNEL.format(body="  float registered = 1;\n  out[i] = registered;")),
    "lambda": ("no lambdas", KERNEL.format(body="  auto twice = [](float v) { return v * 2; };\n  out[i] = twice(out[i]);"),
               "struct Twice { float operator()(float v) const { return v * 2; } };\n" +
               KERNEL.format(body="  float a[2] = {1, 2};\n  [[maybe_unused]] Twice twice;\n"
                                  "  out[i] = twice(a[i % 2]);")),
    "std::": ("no C/C++ standard library", KERNEL.format(body="  out[i] = std::max(out[i], 0.0f);"),
              KERNEL.format(body="  float std = metal::max(out[i], 0.0f);  // std as a name\n  out[i] = std;")),
    "C library": ("no C/C++ standard library", KERNEL.format(body='  printf("%f", out[i]);'),
                  "float rand01(uint seed) { return float(seed % 7) / 7; }\n" +
                  KERNEL.format(body="  out[i] = rand01(i);")),
    "#include <cstdio>": ("no C/C++ standard library", "#include <cstdio>\n" + KERNEL.format(body=""),
                          "#include <metal_math>\n" + KERNEL.format(body="  out[i] = metal::exp(0.0f);")),
    "pointer parameter": ("address space", "float first(float* p) {\n  return p[0];\n}\n" + KERNEL.format(body="  out[i] = 1;"),
                          "float first(device float* p) { return p[0]; }\n"
                          "template <typename T> T second(T* p) { return p[1]; }  // T carries the space\n" +
                          KERNEL.format(body="  out[i + 1] = 2;\n  out[i] = first(out + i + 1) + second<device float>(out + i);")),
    "reference parameter": ("address space", "void bump(float& x) {\n  x += 1;\n}\n" + KERNEL.format(body="  out[i] = 1;"),
                            "void bump(thread float& x) { x += 1; }\n" +
                            KERNEL.format(body="  float v = float(i);\n  bump(v);\n  out[i] = v;")),
    "pointer variable": ("address space", KERNEL.format(body="  float* p = out;\n  p[i] = 1;"),
                         KERNEL.format(body="  device float* p = out;\n  thread float v = 2;\n"
                                            "  thread float& r = v;\n  p[i] = r;")),
    "pointer member": ("address space", "struct View {\n  float* data;\n};\n" + KERNEL.format(body="  out[i] = 1;"),
                       "struct View { device float* data; };\n" +
                       KERNEL.format(body="  View v{out};\n  v.data[i] = 1;")),
    "program scope variable": ("program scope variable", "float scale = 2.0f;\n" + KERNEL.format(body="  out[i] = scale;"),
                               "constant float scale = 2.0f;\nstatic constant constexpr const float offset = 1.0f;\n"
                               "constexpr constant static float table[2] = {0, 1};\n" +
                               KERNEL.format(body="  out[i] = scale + offset + table[i % 2];")),
    "static variable": ("static variable", KERNEL.format(body="  static int calls = 0;\n  out[i] = float(calls++);"),
                        "struct Limits { static constant constexpr int n = 3; };\nconstant float k = 0.5f;\n" +
                        KERNEL.format(body="  out[i] = k * Limits::n;")),
    "static constant": ("static variable", KERNEL.format(body="  static constant float k = 0.5f;\n  out[i] = k;"),
                        "constant float k = 0.5f;\n" + KERNEL.format(body="  out[i] = k;")),
    "kernel call": ("kernel call", "kernel void fill(device float* out [[buffer(0)]]) {\n  out[0] = 1;\n}\n" +
                    KERNEL.format(body="  fill(out);"),
                    "void fill(device float* out) { out[0] = 1; }\n" + KERNEL.format(body="  fill(out + i);")),
    "thread pointer argument": ("kernel argument address space",
                                "kernel void k(device float* out [[buffer(0)]],\n  thread float* scratch [[buffer(1)]]) {\n"
                                "  out[0] = scratch[0];\n}\n",
                                KERNEL.format(body="  float v = 1;\n  thread float* scratch = &v;\n  out[i] = *scratch;")),
    "by-value argument": ("kernel argument attribute",
                          "kernel void k(device float* out [[buffer(0)]],\n  float scale) {\n  out[0] = scale;\n}\n",
                          "kernel void k(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]],\n"
                          "  uint n [[threads_per_grid]]) {\n  out[i] = float(n);\n}\n"),
    "buffer on threadgroup pointer": ("argument binding",
                                      "kernel void k(device float* out [[buffer(0)]],\n"
                                      "  threadgroup float* tg [[buffer(1)]]) {\n  out[0] = tg[0];\n}\n",
                                      KERNEL.format(body="  threadgroup float tg[1];\n  tg[0] = 2;\n"
                                                         "  threadgroup_barrier(mem_flags::mem_threadgroup);\n"
                                                         "  out[i] = tg[0];")),
    "threadgroup on device pointer": ("argument binding",
                                      "kernel void k(device float* out [[buffer(0)]],\n"
                                      "  device float* more [[threadgroup(0)]]) {\n  out[0] = more[0];\n}\n",
                                      KERNEL.format(body="  out[i] = 3;")),
    "grid size type": ("attribute type",
                       "kernel void k(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]],\n"
                       "  ushort n [[threads_per_grid]]) {\n  out[i] = n;\n}\n",
                       "kernel void k(device float* out [[buffer(0)]], ushort i [[thread_position_in_grid]],\n"
                       "  ushort n [[threads_per_grid]], ushort g [[threadgroup_position_in_grid]]) {\n"
                       "  out[i] = n + g;\n}\n"),
    "simdgroup types": ("attribute type",
                        "kernel void k(device float* out [[buffer(0)]], uint lane [[thread_index_in_simdgroup]],\n"
                        "  ushort width [[threads_per_simdgroup]]) {\n  out[lane] = width;\n}\n",
                        "kernel void k(device float* out [[buffer(0)]], ushort lane [[thread_index_in_simdgroup]],\n"
                        "  ushort width [[threads_per_simdgroup]], uint sg [[simdgroup_index_in_threadgroup]]) {\n"
                        "  out[lane] = width + sg;\n}\n"),
    "index beside a uint position": ("attribute type",
                                     "kernel void k(device float* out [[buffer(0)]],\n"
                                     "  uint3 p [[thread_position_in_threadgroup]],\n"
                                     "  ushort t [[thread_index_in_threadgroup]]) {\n  out[t] = p.x;\n}\n",
                                     "kernel void k(device float* out [[buffer(0)]],\n"
                                     "  ushort3 p [[thread_position_in_threadgroup]],\n"
                                     "  ushort t [[thread_index_in_threadgroup]]) {\n  out[t] = p.x;\n}\n"),
    "program-scope built-in type": ("attribute type", "int gid [[thread_position_in_grid]];\n" +
                                    KERNEL.format(body="  out[gid] = 1;"),
                                    "uint gid [[thread_position_in_grid]];\n" + KERNEL.format(body="  out[gid] = 1;")),
    "matrix column": ("matrix index", KERNEL.format(body="  float2x2 m = float2x2(1);\n  out[i] = m[2][0];"),
                      KERNEL.format(body="  float2x2 m = float2x2(1);\n  float4 m4 = float4(2);\n"
                                         "  out[i] = m[1][1] + m4[3];")),
    "matrix row": ("matrix index", KERNEL.format(body="  float3x2 m = float3x2(1);\n  out[i] = m[0][2];"),
                   KERNEL.format(body="  float3x2 m = float3x2(1);\n  out[i] = m[2][1];")),
    "function constant index": ("function constant",
                                "constant bool wide [[function_constant(70000)]];\n" + KERNEL.format(body="  out[i] = wide;"),
                                "constant bool wide [[function_constant(65535)]];\n" +
                                KERNEL.format(body="  out[i] = wide ? 2 : 1;")),
    "function constant type": ("function constant",
                               "struct Pair { int a, b; };\nconstant Pair pair [[function_constant(0)]];\n" +
                               KERNEL.format(body="  out[i] = pair.a;"),
                               "constant half2 pair [[function_constant(0)]];\n" + KERNEL.format(body="  out[i] = pair.x;")),
    "kernel return type": ("kernel return type",
                           "kernel float k(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {\n"
                           "  return out[i];\n}\n",
                           "[[kernel]] void k(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {\n"
                           "  out[i] = 1;\n}\n"),
    "kernel overload": ("kernel overload",
                        KERNEL.format(body="  out[i] = 1;") +
                        "kernel void k(device int* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {}\n",
                        KERNEL.format(body="  out[i] = 1;") +
                        "kernel void k_int(device int* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {}\n"),
    "position type": ("attribute type",
                      "kernel void k(device float* out [[buffer(0)]],\n  int i [[thread_position_in_grid]]) {\n"
                      "  out[i] = 1;\n}\n",
                      "kernel void k(device float* out [[buffer(0)]],\n  ushort2 i [[thread_position_in_grid]],\n"
                      "  ushort2 n [[threads_per_grid]], ushort lane [[thread_index_in_simdgroup]]) {\n"
                      "  out[i.y * n.x + i.x] = 1;\n}\n"),
    "position vector width": ("attribute type",
                              "kernel void k(device float* out [[buffer(0)]],\n  uint4 i [[thread_position_in_grid]]) {\n"
                              "  out[i.x] = 1;\n}\n",
                              "kernel void k(device float* out [[buffer(0)]],\n  uint3 i [[thread_position_in_grid]]) {\n"
                              "  out[i.x] = 1;\n}\n"),
    "threadgroup initializer": ("threadgroup initializer", KERNEL.format(body="  threadgroup float t = 1;\n  out[i] = t;"),
                                KERNEL.format(body="  threadgroup float t;\n  if (i == 0) t = 1;\n"
                                                   "  threadgroup_barrier(mem_flags::mem_threadgroup);\n  out[i] = t;")),
    "buffer index range": ("argument index", "kernel void k(device float* out [[buffer(31)]]) {\n  out[0] = 1;\n}\n",
                           "kernel void k(device float* out [[buffer(0)]],\n  uint i [[thread_position_in_grid]]) {\n"
                           "  out[i] = 30;  // the last slot\n}\n"),
    "buffer bound twice": ("argument index",
                           "kernel void k(device float* out [[buffer(0)]],\n  device float* more [[buffer(0)]]) {\n"
                           "  out[0] = more[0];\n}\n",
                           "kernel void k(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]],\n"
                           "  uint more [[threads_per_grid]]) {\n  out[i] = more;\n}\n"),
    "vector initializer": ("vector initializer", KERNEL.format(body="  float2 v = {1, 2, 3};\n  out[i] = v.x;"),
                           KERNEL.format(body="  float2 v = {1, 2};\n  uint4 u{1, 2, 3};\n"
                                              "  float4 w = {v, 4, 5};\n  out[i] = v.y + u.z + w.w;")),
    "index type": ("attribute type",
                   "kernel void k(device float* out [[buffer(0)]],\n  uint2 lane [[thread_index_in_simdgroup]]) {\n"
                   "  out[lane.x] = 1;\n}\n",
                   "kernel void k(device float* out [[buffer(0)]],\n  uint lane [[thread_index_in_simdgroup]]) {\n"
                   "  out[lane] = 1;\n}\n"),
}
# Text on the line each violation must be reported at.
NEEDLES = {
    'double': 'double x',
    'long double': 'long double',
    'new': 'new float',
    'delete': 'delete p',
    'try': 'try',
    'throw': 'throw',
    'virtual': 'virtual',
    'typeid': 'typeid',
    'dynamic_cast': 'dynamic_cast',
    'goto': 'goto',
    'thread_local': 'thread_local',
    'register': 'register float',
    'lambda': '[](',
    'std::': 'std::',
    'C library': 'printf',
    '#include <cstdio>': '<cstdio>',
    'pointer parameter': 'float* p',
    'reference parameter': 'float& x',
    'pointer variable': 'float* p',
    'pointer member': 'float* data',
    'program scope variable': 'float scale',
    'static variable': 'static int',
    'static constant': 'static constant',
    'kernel call': 'fill(out)',
    'thread pointer argument': 'thread float*',
    'by-value argument': 'float scale',
    'buffer on threadgroup pointer': 'threadgroup float*',
    'threadgroup on device pointer': 'device float* more',
    'grid size type': 'ushort n',
    'simdgroup types': 'ushort width',
    'index beside a uint position': 'ushort t',
    'program-scope built-in type': 'int gid',
    'matrix column': 'm[2]',
    'matrix row': 'm[0][2]',
    'function constant index': '70000',
    'function constant type': 'Pair pair',
    'kernel return type': 'kernel float',
    'kernel overload': 'device int*',
    'position type': 'int i [[',
    'position vector width': 'uint4 i',
    'index type': 'uint2 lane',
    'vector initializer': '{1, 2, 3}',
    'threadgroup initializer': 'float t = 1',
    'buffer index range': 'buffer(31)',
    'buffer bound twice': 'float* more',
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_rule_violation_is_named_with_its_line(tmp_path, case):
    rule, invalid, _ = CASES[case]
    path = tmp_path / "invalid.metal"
    path.write_text(HEADER + invalid)
    with pytest.raises(TranslateError) as info:
        translate(path)
    message = str(info.value)
    assert f"MSL rule '{rule}'" in message, message
    line = next(n for n, text in enumerate(path.read_text().splitlines(), 1) if NEEDLES[case] in text)
    assert message.startswith(f"{path}:{line}: "), message


@pytest.mark.parametrize("case", sorted(CASES))
def test_valid_twin_is_accepted(tmp_path, case):
    _, _, valid = CASES[case]
    path = tmp_path / "valid.metal"
    path.write_text(HEADER + valid)
    assert translate(path).kernels


def test_rule_violations_are_compile_errors(shader):
    with pytest.raises(CompileError, match=r"\.metal:4: MSL rule 'no double'"):
        shader(HEADER + CASES["double"][1], name="rule_double")


def test_valid_twins_compile_and_run(shader):
    # Every twin in one module (each in its own namespace, its kernels renamed), so one compiler run
    # covers them all; each kernel writes a number over the NaN its output starts as.
    parts, names = [], []
    for n, case in enumerate(sorted(CASES)):
        src = CASES[case][2]
        if "#include" in src:
            continue
        src = re.sub(r"\bvoid k(_int)?\(", lambda m: f"void k{n}{m.group(1) or ''}(", src)
        names.append(f"k{n}")
        parts.append(f"namespace twin{n} {{\n{src}\n}}\n")
    lib = shader(HEADER + "".join(parts), name="rule_twins")
    for name in names:
        out = torch.full((4,), float("nan"))
        getattr(lib, name)(out, threads=1 if name != names[0] else 4)
        assert not out[0].isnan(), name


def test_program_scope_constant_is_initialized_by_a_constant_expression(shader):
    # Checked by the C++ compiler (constinit), named as the translator's own rules are.
    invalid = HEADER + "float two() { return 2; }\nconstant float scale = two();\n" + \
        KERNEL.format(body="  out[i] = scale;")
    with pytest.raises(CompileError, match=r"\.metal:4:\d+: error: MSL rule 'constant initializer'"):
        shader(invalid, name="rule_constant_initializer")
    valid = HEADER + "constexpr float two() { return 2; }\nconstant float scale = two() * 3;\n" + \
        KERNEL.format(body="  out[i] = scale;")
    out = torch.zeros(3)
    shader(valid, name="rule_constant_initializer_twin").k(out)
    assert out.tolist() == [6, 6, 6]


# Rules of MSL section 2 and 4 that the C++ compiler or the shim's types enforce, their errors not named as
# rules: case -> (invalid body, valid neighbour that writes the value expected in out[i]).
COMPILER_CASES = {
    "vector constructor": ("  float4 v = float4(float2(1), 2);  // BAD\n  out[i] = v.x;",
                           "  float4 v = float4(float2(1), 2, 3);\n  out[i] = v.w;", 3),
    "vector component": ("  float2 v = 1;\n  out[i] = v.z;  // BAD", "  float2 v = float2(1, 4);\n  out[i] = v.g;", 4),
    "swizzle sets": ("  float4 v = 1;\n  float2 w = v.xg;  // BAD\n  out[i] = w.x;",
                     "  float4 v = float4(5, 6, 7, 8);\n  float2 w = v.rg;\n  out[i] = w.x;", 5),
    "repeated lane assigned": ("  float4 v = 1;\n  v.xx = float2(1, 2);  // BAD\n  out[i] = v.x;",
                               "  float4 v = 1;\n  v.xy = float2(3, 2);\n  float2 w = v.xx;\n  out[i] = v.x + w.y;", 6),
    "as_type size": ("  out[i] = as_type<float>(half(1));  // BAD",
                     "  out[i] = float(as_type<half2>(as_type<float>(half2(7))).y);", 7),
    "constant write": ("  scale = 2;  // BAD\n  out[i] = scale;", "  out[i] = scale * 8;", 8),
    "vector conversion": ("  float4 b = int4(1);  // BAD\n  out[i] = b.x;",
                          "  float4 b = float4(int4(9));\n  out[i] = b.x;", 9),
    "vector to scalar": ("  float s = float4(1);  // BAD\n  out[i] = s;", "  float s = float4(10).x;\n  out[i] = s;", 10),
}


def _compiler_cases(which: int) -> str:
    return HEADER + "constant float scale = 1;\n" + "".join(
        KERNEL.format(body=case[which]).replace("void k(", f"void k{n}(") for n, case in enumerate(COMPILER_CASES.values()))


def test_rules_the_compiler_enforces(shader):
    # One compiler run reports every violation, each at its own line.
    source = _compiler_cases(0)
    with pytest.raises(CompileError) as info:
        shader(source, name="rule_compiler_cases")
    bad = [n for n, text in enumerate(source.splitlines(), 1) if "// BAD" in text]
    for case, line in zip(COMPILER_CASES, bad, strict=True):
        assert f".metal:{line}:" in str(info.value), case
    lib = shader(_compiler_cases(1), name="rule_compiler_twins")
    for n, (case, (_, _, expected)) in enumerate(COMPILER_CASES.items()):
        out = torch.zeros(2)
        getattr(lib, f"k{n}")(out)
        assert out.tolist() == [expected, expected], case


def test_literals_in_strings_and_comments_are_not_code(tmp_path):
    path = tmp_path / "strings.metal"
    path.write_text(HEADER + '// goto, new, delete, try, std::max, printf("x")\n'
                    '/* double virtual typeid */\n' + KERNEL.format(body="  out[i] = 1;"))
    assert translate(path).kernels


# Valid MSL that a stricter reading of the specification would reject: recursion (MSL 1.5.4: compute
# functions since Metal 2.4), a function constant as a binding index (5.8.1.4) and a built-in variable at
# program scope (5.9, Metal 3.1).
VALID = HEADER + """
constant int out_slot [[function_constant(0)]];
uint gid [[thread_position_in_grid]];
typedef void (filler_t)(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]);  // ggml's
uint fib(uint n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }
bool odd(uint n);
bool even(uint n) { return n == 0 ? true : odd(n - 1); }
bool odd(uint n) { return n == 0 ? false : even(n - 1); }
float half_position() { return float(gid) * 0.5f; }
kernel void valid(device float* unused [[buffer(0)]], device float* out [[buffer(out_slot)]]) {
  out[gid * 3] = fib(gid);
  out[gid * 3 + 1] = even(gid);
  out[gid * 3 + 2] = half_position();
}
"""


def test_recursion_function_constant_index_and_program_scope_builtin(shader):
    lib = shader(VALID, name="rule_valid", constants={"out_slot": 1})
    n = 12
    out = torch.full((n, 3), float("nan"))
    with mps_ext.trace() as t:
        lib.valid(torch.empty(1), out, threads=n)
    assert t.names == ["valid"]
    fib = [0, 1]
    while len(fib) < n:
        fib.append(fib[-1] + fib[-2])
    i = torch.arange(n)
    expected = torch.stack([torch.tensor(fib, dtype=torch.float32), (i % 2 == 0).float(), i * 0.5], 1)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_function_constant_index_needs_a_value(shader):
    with pytest.raises(CompileError, match=r"\[\[buffer\(out_slot\)\]\]: the function constant 'out_slot' "
                                           r"has no value"):
        shader(VALID, name="rule_valid_unset")


VERSIONED = HEADER + """#if __METAL_VERSION__ >= 320
kernel void k32(coherent(device) device float* out [[buffer(0)]]) { out[0] = 1; }
#else
kernel void k31(device float* out [[buffer(0)]]) { out[0] = 1; }
#endif
kernel void k(coherent(device) device float* out [[buffer(0)]]) { out[0] = 1; }
"""


def test_msl_version_setting(tmp_path):
    # __METAL_VERSION__ and the version-gated rules follow the target; 3.1 is the default.
    path = tmp_path / "versioned.metal"
    path.write_text(VERSIONED)
    assert [k.host_name for k in translate(path, msl_version="3.2").kernels] == ["k32", "k"]
    with pytest.raises(TranslateError, match=rf"^{path}:8: MSL rule 'msl version': memory coherence .* needs MSL 3.2; "
                                             r"the source targets MSL 3.1"):
        translate(path)
    with pytest.raises(ValueError, match=r"msl_version must be one of '3.1', '3.2', got '4.0'"):
        translate(path, msl_version="4.0")


LOGGING = HEADER + """#include <metal_logging>
kernel void k(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  os_log_default.log("thread %u", i);
  out[i] = 1;
}
"""


@pytest.mark.parametrize("source,line,what", [
    (LOGGING, 3, r"shader logging \(<metal_logging>: os_log\)"),
    (LOGGING.replace("#include <metal_logging>\n", ""), 4, r"shader logging \(os_log_default, <metal_logging>\)"),
    (HEADER + "constant metal::os_log logger(\"a\", \"b\");\n" + KERNEL.format(body="  out[i] = 1;"), 3,
     r"shader logging \(os_log, <metal_logging>\)"),
])
def test_shader_logging_needs_msl32(tmp_path, source, line, what):
    path = tmp_path / "logging.metal"
    path.write_text(source)
    with pytest.raises(TranslateError, match=rf"^{path}:{line}: MSL rule 'msl version': {what} needs MSL 3.2; "
                                             r"the source targets MSL 3.1 \(msl_version\)"):
        translate(path)
    assert translate(path, msl_version="3.2").kernels


def test_own_os_log_is_not_metal_logging(shader):
    # MLX's logging.h declares an os_log of its own for MSL 3.1: a 3.1 source's names, not <metal_logging>'s.
    out = torch.zeros(2)
    shader(HEADER + "namespace mlx {\nstruct os_log {\n  constexpr os_log(constant char*, constant char*) constant {}\n"
           "  void log_debug(constant char*, int) const constant {}\n};\n}  // namespace mlx\n"
           "constant mlx::os_log logger(\"mlx\", \"k\");\n" +
           KERNEL.format(body="  logger.log_debug(\"%d\", int(i));\n  out[i] = 2;"), name="rule_own_os_log").k(out)
    assert out.tolist() == [2, 2]
