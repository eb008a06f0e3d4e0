"""MSL address spaces in the simulator: conversions Metal forbids are compile
errors naming the .metal line, overloads on address spaces pick the right
function, and the shim's value types work in every address space.

These need the strict toolchain (clang keeping address spaces as types, see
mps_ext.sim.compiler.toolchain); CI sets MPS_EXT_SIM_ADDRESS_SPACES=1, so
there a missing clang is a failure, not a skip."""

from pathlib import Path

import pytest
import torch

import mps_ext.sim
from mps_ext.sim import compiler
from mps_ext.testing import assert_close

ROOT = Path(__file__).resolve().parents[1]
TOOLCHAIN = compiler.toolchain()
pytestmark = pytest.mark.skipif(not TOOLCHAIN.address_spaces, reason=f"address spaces erased: {TOOLCHAIN.note}")

HEAD = "#include <metal_stdlib>\nusing namespace metal;\n"
# One forbidden conversion each; the line marked BAD is the one the error must name.
FORBIDDEN = {
    "device_ptr_to_threadgroup": """
kernel void k(device float* d [[buffer(0)]]) {
  threadgroup float t[4];
  device float* p = t;  // BAD
  p[0] = 1; d[0] = t[0];
}""",
    "threadgroup_ptr_to_device": """
kernel void k(device float* d [[buffer(0)]]) {
  threadgroup float* p = d;  // BAD
  p[0] = 1;
}""",
    "thread_ref_to_device": """
kernel void k(device float* d [[buffer(0)]]) {
  thread float& r = d[0];  // BAD
  r = 1;
}""",
    "thread_ptr_to_device": """
kernel void k(device float* d [[buffer(0)]]) {
  thread float* p = d;  // BAD
  p[0] = 1;
}""",
    "constant_ptr_passed_as_device": """
void f(device float* p) { p[0] = 1; }
kernel void k(constant float* c [[buffer(0)]]) {
  f(c);  // BAD
}""",
    "device_ptr_passed_as_constant": """
float f(constant float* p) { return p[0]; }
kernel void k(device float* d [[buffer(0)]]) {
  d[1] = f(d);  // BAD
}""",
    "thread_address_as_threadgroup": """
kernel void k(device float* d [[buffer(0)]]) {
  float x = 1;
  threadgroup float* p = &x;  // BAD
  d[0] = p[0];
}""",
    "threadgroup_ref_to_device": """
kernel void k(device float* d [[buffer(0)]]) {
  threadgroup float& r = d[0];  // BAD
  r = 1;
}""",
    "device_ref_to_thread": """
kernel void k(device float* d [[buffer(0)]]) {
  float x = 0;
  device float& r = x;  // BAD
  d[0] = r;
}""",
    "thread_ref_helper_on_device": """
void inc(thread float& x) { x += 1; }
kernel void k(device float* d [[buffer(0)]]) {
  inc(d[0]);  // BAD
}""",
    "constant_ptr_to_thread": """
kernel void k(constant float* c [[buffer(0)]], device float* d [[buffer(1)]]) {
  const thread float* p = c;  // BAD
  d[0] = p[0];
}""",
    "half_thread_ref_to_device": """
kernel void k(device half* d [[buffer(0)]]) {
  thread half& r = d[0];  // BAD
  r = 1;
}""",
    "vector_thread_ref_to_threadgroup": """
kernel void k(device float4* d [[buffer(0)]]) {
  threadgroup float4 t[2];
  thread float4& r = t[0];  // BAD
  d[0] = r;
}""",
    "reinterpret_cast_across_spaces": """
kernel void k(device float* d [[buffer(0)]]) {
  threadgroup float t[4];
  device float* p = reinterpret_cast<device float*>(t);  // BAD
  d[0] = p[0];
}""",
    "atomic_in_thread_memory": """
kernel void k(device uint* d [[buffer(0)]]) {
  atomic_uint a;
  d[0] = atomic_fetch_add_explicit(&a, 1u, memory_order_relaxed);  // BAD
}""",
    "struct_thread_ref_to_device": """
struct S { float4 v; float a; };
kernel void k(device S* d [[buffer(0)]]) {
  thread S& r = d[0];  // BAD
  r.a = 1;
}""",
    "struct_thread_ref_parameter_from_device": """
struct S { float4 v; float a; };
void f(thread S& r) { r.a = 1; }
kernel void k(device S* d [[buffer(0)]]) {
  f(d[0]);  // BAD
}""",
    "struct_thread_ref_returned_from_device": """
struct S { float4 v; float a; };
thread S& at(device S* d) { return d[0]; }  // BAD
kernel void k(device S* d [[buffer(0)]]) {
  at(d).a = 1;
}""",
    "simdgroup_load_from_thread_memory": """
kernel void k(device float* d [[buffer(0)]]) {
  float x[64] = {};
  simdgroup_float8x8 m;
  simdgroup_load(m, x);  // BAD
  simdgroup_store(m, d);
}""",
}


@pytest.mark.parametrize("name", FORBIDDEN)
def test_forbidden_conversion_is_a_compile_error(name):
    source = HEAD + FORBIDDEN[name].lstrip("\n") + "\n"
    line = next(n for n, text in enumerate(source.splitlines(), 1) if "// BAD" in text)
    with pytest.raises(mps_ext.sim.CompileError) as info:
        mps_ext.sim.compile_shader(source, name=f"forbidden_{name}")
    assert f".metal:{line}:" in str(info.value), str(info.value)


def test_messages_name_msl_address_spaces():
    source = HEAD + FORBIDDEN["device_ptr_to_threadgroup"].lstrip("\n")
    with pytest.raises(mps_ext.sim.CompileError, match=r"'device float \*' with an lvalue of type 'threadgroup float\[4\]'"):
        mps_ext.sim.compile_shader(source, name="forbidden_message")


@pytest.mark.parametrize("path", sorted((ROOT / "metal").glob("*.metal")) + sorted((ROOT / "tests" / "kernels").glob("*.metal")),
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_kernels_compile_with_address_spaces(path):
    """The package's kernels are built into the extension with address spaces erased; they must obey them too."""
    compiler.check_file(path, include_dirs=[ROOT / "metal" / "include"])


@pytest.fixture(scope="module")
def lib(kernels):
    return kernels("address_spaces")


def test_overloads_on_address_space(lib):
    out = torch.full((7,), -1, dtype=torch.int32)
    lib.overloads(out, torch.zeros(4), torch.zeros(4), threads=1)
    assert out.tolist() == [0, 1, 2, 3, 1, 3, 0]


def test_half_and_bfloat_in_every_space(lib):
    n = 32
    g = torch.Generator().manual_seed(0)
    h = torch.randn(n, generator=g).half()
    b = torch.randn(n, generator=g).bfloat16()
    ch = torch.tensor([0.75, -1.5]).half()
    out = torch.empty(n)
    h_in, b_in = h.clone(), b.clone()
    with mps_ext.sim.checked():
        lib.half_values(h, b, ch, out, threads=n, group_size=n)
    th = h_in + ch[0]
    tb = b_in * 2
    h_new = th * ch[1] - th
    b_new = (-tb).float() - 1.0
    torch.testing.assert_close(h, h_new, rtol=0, atol=0)
    torch.testing.assert_close(b, b_new.bfloat16(), rtol=0, atol=0)
    expected = tb.float() + ch[0].float() + torch.maximum(th, ch[1]).float() + h_new.abs().float()
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-6)


def test_vectors_packed_vectors_and_swizzles_in_every_space(lib):
    n = 32
    g = torch.Generator().manual_seed(1)
    v = torch.randn(n, 4, generator=g)
    p = torch.randn(n, 3, generator=g)
    c = torch.tensor([0.5, -1.0, 2.0, -0.25]).half()
    out = torch.empty(n, 2, dtype=torch.float16)
    v_in, p_in = v.clone(), p.clone()
    with mps_ext.sim.checked():
        lib.vector_values(v, p, c, out, threads=n, group_size=n)
    tv = v_in.clone()
    tv[:, [0, 1]] = tv[:, [1, 0]]
    tv += c.float()
    tv[:, 3] = (tv * v_in).sum(1)
    tp = p_in * 2
    ve = v_in.clone()
    ve[:, 2], ve[:, 3] = tv[:, 3], tv[:, 2]
    ve = ve + tv.abs().sqrt() + torch.cat([tp, torch.ones(n, 1)], 1)
    ve[:, 0] -= p_in[:, 1]
    pe = tv[:, :3] - p_in
    pe[:, 2] = c[3].float()
    oe = c[:2] + ve[:, [2, 0]].half()
    oe = torch.where(c[[2, 1]] > 0, -oe, oe)
    torch.testing.assert_close(v, ve, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(p, pe, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(out, oe, rtol=0, atol=0)


def test_atomics_on_device_and_threadgroup_memory(lib):
    groups, n = 3, 32
    x = torch.randint(0, 1000, (groups * n,), dtype=torch.int32, generator=torch.Generator().manual_seed(2))
    counts = torch.zeros(5, dtype=torch.int32)
    total = torch.zeros(1)
    out = torch.zeros(groups * 4, dtype=torch.int32)
    with mps_ext.sim.checked():
        lib.atomic_values(counts, total, x, out, threads=groups * n, group_size=n)
    per_group = torch.stack([torch.bincount(x[k * n:(k + 1) * n] % 4, minlength=4) for k in range(groups)])
    assert out.view(groups, 4).tolist() == per_group.tolist()
    assert counts[:4].tolist() == per_group.sum(0).tolist()
    assert counts[4].item() == x.max().item()
    assert total.item() == x.sum().item()


def test_simdgroup_matrices_on_device_and_threadgroup_memory(lib):
    g = torch.Generator().manual_seed(3)
    a = torch.randn(64, generator=g).half()
    b = torch.randn(64, generator=g)
    c = torch.empty(64)
    with mps_ext.sim.checked():
        lib.matrix_values(a, b, c, threads=32, group_size=32)
    product = (a.float().view(8, 8) @ b.view(8, 8).T).flatten()
    expected = product + product[:4].sum() - b[:4].sum()
    torch.testing.assert_close(c, expected, rtol=1e-5, atol=1e-5)


def test_program_scope_constants(lib):
    n = 12
    out = torch.empty(n)
    lib.constant_values(out, threads=n)
    table = torch.tensor([1.0, 2, 3, 4]) * 2
    lanes = torch.cat([table, table])
    i = torch.arange(n)
    expected = lanes[(i + 1) % 8] + 0.25 + torch.tensor([0.5, 1.5, 2.5, 3.5])[i % 4]
    torch.testing.assert_close(out, expected)


# Member functions qualified with an address space (MLX's complex.h, logging.h, the _NoMask of its
# masked GEMMs): the one for the object's space is called, in both modes.
QUALIFIED_MEMBERS = HEAD + """
struct pair_t {
  float a, b;
  pair_t() thread : a(0), b(0) {}
  pair_t() threadgroup : a(0), b(0) {}
  float sum() const thread { return a + b; }
  float sum() const device { return 10 + a + b; }
  float sum() const threadgroup { return 20 + a + b; }
  float first() const constant { return a; }
  operator float() const thread { return a - b; }
  operator float() const device { return 100 + a - b; }
  template <typename U, enable_if_t<sizeof(U) < 8, bool> = true>
  float scaled(U k) const device { return a * k; }
};
float total(constant const float v[2], device const float w[3]) { return v[0] + v[1] + w[2]; }
kernel void members(device const pair_t* in [[buffer(0)]], constant pair_t* c [[buffer(1)]],
                    device float* out [[buffer(2)]], uint i [[thread_position_in_grid]]) {
  threadgroup pair_t t[1];
  if (i == 0) { t[0].a = 1; t[0].b = 2; }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  pair_t p;
  p.a = 5; p.b = 1;
  out[0] = in[0].sum();
  out[1] = t[0].sum();
  out[2] = p.sum();
  out[3] = c->first();
  out[4] = float(in[1]);
  out[5] = float(p);
  out[6] = in[0].scaled(2);
  out[7] = total(&c->a, &in[0].a);
}
"""


@pytest.mark.parametrize("mode", ["0", "1"], ids=["erased", "strict"])
def test_members_qualified_with_an_address_space(monkeypatch, mode):
    monkeypatch.setenv("MPS_EXT_SIM_ADDRESS_SPACES", mode)
    lib = mps_ext.sim.compile_shader(QUALIFIED_MEMBERS, name="qualified_members")
    out = torch.zeros(8)
    strict = mode == "1"
    lib.members(torch.tensor([1.5, 0.5, 4.0, 3.0]), torch.tensor([7.0, 2.0]), out, threads=1)
    assert out.tolist() == [12 if strict else 2, 23 if strict else 3, 6, 7, 101 if strict else 1, 4, 3, 7 + 2 + 4]


def test_member_qualified_with_another_address_space_is_refused():
    """As Metal: a member qualified `device` only cannot be called on a threadgroup object."""
    source = HEAD + """
struct s_t { float a; float get() const device { return a; } };
kernel void k(device float* out [[buffer(0)]]) {
  threadgroup s_t t[1];
  out[0] = t[0].get();  // BAD
}
"""
    line = next(n for n, text in enumerate(source.splitlines(), 1) if "// BAD" in text)
    with pytest.raises(mps_ext.sim.CompileError, match=f".metal:{line}:"):
        mps_ext.sim.compile_shader(source, name="qualified_member_refused")


def test_member_for_one_address_space_only(monkeypatch):
    """With address spaces erased, a member that only a `device` copy has is still found."""
    monkeypatch.setenv("MPS_EXT_SIM_ADDRESS_SPACES", "0")
    lib = mps_ext.sim.compile_shader(HEAD + """
struct s_t { float a; float twice() const device { return 2 * a; } operator int() const device { return 3; } };
kernel void k(device const s_t* in [[buffer(0)]], device float* out [[buffer(1)]]) {
  out[0] = in[0].twice() + int(in[0]);
}
""", name="device_only_member")
    out = torch.zeros(1)
    lib.k(torch.tensor([1.5]), out, threads=1)
    assert out.item() == 6


@pytest.mark.parametrize("mode", ["0", "1"], ids=["erased", "strict"])
def test_whole_struct_assignment_in_every_address_space(monkeypatch, mode):
    """`buf[i] = s;`, `buf[i] = {a, b};`, `buf[i] = buf[j];` and `s = buf[i];` for user structs and
    vectors in device and threadgroup memory, as MSL allows (MLX's fft/readwrite.h)."""
    monkeypatch.setenv("MPS_EXT_SIM_ADDRESS_SPACES", mode)
    lib = mps_ext.sim.compile_shader(HEAD + """
template <typename T> struct cplx { T re, im; };
kernel void k(device cplx<float>* c [[buffer(0)]], device float2* v [[buffer(1)]],
              uint i [[thread_position_in_grid]]) {
  threadgroup cplx<float> t[2];
  cplx<float> s = {c[0].re, c[0].im};
  t[0] = s;
  t[1] = {5, 6};
  threadgroup_barrier(mem_flags::mem_threadgroup);
  c[1] = t[1];
  c[2] = {t[0].im, t[0].re};
  s = c[3];
  c[0] = s;
  v[0] = {v[1].y, 7};
}
""", name="struct_assignment")
    c = torch.tensor([1.0, 2, 0, 0, 0, 0, 3, 4])
    v = torch.tensor([0.0, 0, 8, 9])
    lib.k(c, v, threads=1)
    assert c.tolist() == [3, 4, 5, 6, 2, 1, 3, 4]
    assert v.tolist() == [9, 7, 8, 9]


def test_whole_typedef_struct_assignment_in_device_memory(monkeypatch):
    """ggml's block types are unnamed structs named by a typedef, with a half2 in an anonymous union:
    `*y = *x;` between device buffers (strict mode: GCC allows no half in an anonymous struct)."""
    monkeypatch.setenv("MPS_EXT_SIM_ADDRESS_SPACES", "1")
    lib = mps_ext.sim.compile_shader(HEAD + """
typedef struct { union { struct { half d; half m; }; half2 dm; }; uchar q[4]; } block;
kernel void k(device const block* x [[buffer(0)]], device block* y [[buffer(1)]],
              uint i [[thread_position_in_grid]]) {
  y[i] = x[i];
}
""", name="typedef_struct_assignment")
    x = torch.arange(16, dtype=torch.float32)
    y = torch.zeros(16)
    lib.k(x, y, threads=8)  # 8 blocks of 8 bytes
    assert torch.equal(x.view(torch.uint8), y.view(torch.uint8))


# A struct with vectors (float4, half2, a packed vector) and a nested struct: 48 bytes, 12 floats, in MSL's
# layout (inner at float 4, its half2 the halves 8 and 9, its packed_float3 floats 5..7; a at float 8).
COPIED_STRUCTS = """
struct inner { half2 h; packed_float3 p; };
struct S { float4 v; inner in; float a; };
template <typename T> struct cplx { T re, im; };
float value(S s) { return s.v.x + 2 * s.v.w + 3 * float(s.in.h.y) + 4 * s.in.p[2] + 5 * s.a; }
float bumped(S s) { s.a += 1; return value(s); }
template <typename T> T same(T x) { return x; }
S load(device const S* b, uint i) { return b[i]; }
S load(threadgroup const S& r) { return r; }
inner nested(constant S& c) { return c.in; }
"""


def _copied_value(x: torch.Tensor) -> torch.Tensor:
    h = x.view(torch.float16)[:, 9].float()
    return x[:, 0] + 2 * x[:, 3] + 3 * h + 4 * x[:, 7] + 5 * x[:, 8]


@pytest.mark.parametrize("mode", ["0", "1"], ids=["erased", "strict"])
def test_structs_copied_by_value_out_of_every_address_space(monkeypatch, mode):
    """MSL copies a struct out of device, constant or threadgroup memory wherever one is initialized by
    value: `S s(buf[i]);`, `S s{buf[i]};`, an argument for a by-value parameter (of a template too),
    `return buf[i];` and functional casts (`S(buf[i])`), for structs holding vectors, packed vectors and a
    nested struct."""
    monkeypatch.setenv("MPS_EXT_SIM_ADDRESS_SPACES", mode)
    lib = mps_ext.sim.compile_shader(HEAD + COPIED_STRUCTS + """
kernel void k(device const S* b [[buffer(0)]], constant S* c [[buffer(1)]], device S* o [[buffer(2)]],
              device float* out [[buffer(3)]], device cplx<float>* z [[buffer(4)]],
              uint i [[thread_position_in_grid]], uint l [[thread_position_in_threadgroup]]) {
  threadgroup S t[4];
  t[l] = b[i];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  S paren(b[i]);
  S brace{c[i]};
  S tg(t[l]);
  inner n(same(c[i]).in);
  S from_nested = load(b, i);
  from_nested.in = nested(c[i]);
  S returned = load(t[l]);
  returned.a += n.p[2];
  device float* row = out + 8 * i;
  row[0] = value(paren);
  row[1] = value(brace);
  row[2] = bumped(b[i]);
  row[3] = value(same(t[l]));
  row[4] = value(tg);
  row[5] = value(from_nested);
  row[6] = value(returned);
  cplx<float> w{z[i]};
  row[7] = same(z[i]).re + w.im + cplx<float>(z[i]).im - S{c[i]}.a;
  o[i] = load(b, i);
}
""", name="struct_copies")
    n = 4
    x = torch.arange(n * 12, dtype=torch.float32).reshape(n, 12) % 7
    x.view(torch.float16)[:, 8:10] = torch.tensor([[0.5, 1.5], [2.0, -1.0], [3.25, 0.0], [-2.5, 4.0]])
    z = torch.arange(2 * n, dtype=torch.float32)
    b, c, o, out = x.clone(), x.clone(), torch.zeros(n, 12), torch.zeros(n, 8)
    with mps_ext.trace() as tr:
        lib.k(b, c, o, out, z, threads=n, group_size=n)
    assert tr.names == ["k"]
    v = _copied_value(x)
    expected = torch.stack([v, v, v + 5, v, v, v, v + 5 * x[:, 7], z[0::2] + 2 * z[1::2] - x[:, 8]], 1)
    assert_close(out, expected)
    assert torch.equal(o[:, :9], x[:, :9])  # every member (a copy need not keep the padding)
    assert torch.equal(b, x) and torch.equal(c, x)  # copies: the buffers unchanged


@pytest.mark.parametrize("mode", ["0", "1"], ids=["erased", "strict"])
def test_constant_object_built_by_a_constructor(monkeypatch, mode):
    """MLX's logging.h: a program-scope `constant` object built from string literals, which are
    constant-space text in MSL, and a member qualified `constant` called on it."""
    monkeypatch.setenv("MPS_EXT_SIM_ADDRESS_SPACES", mode)
    lib = mps_ext.sim.compile_shader(HEAD + """
struct tag_t {
  int n;
  constexpr tag_t(constant char* a, int b) constant : n(b + a[0]) {}
  int length(constant char* s) const constant { int k = 0; while (s[k]) k++; return k + n; }
};
constant tag_t tag("A", 1);
kernel void k(device int* out [[buffer(0)]]) { out[0] = tag.length("four"); }
""", name="constant_object")
    out = torch.zeros(1, dtype=torch.int32)
    lib.k(out, threads=1)
    assert out.item() == 4 + 1 + ord("A")
