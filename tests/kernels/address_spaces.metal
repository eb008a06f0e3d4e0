// Address spaces in the simulator: overloads that differ only by address
// space, and MSL's value types (half, bfloat, vectors, packed vectors,
// swizzles, atomics, simdgroup matrices) used in every address space.
#include <metal_stdlib>
using namespace metal;

int space_of(thread const float*) { return 0; }
int space_of(device const float*) { return 1; }
int space_of(constant float*) { return 2; }
int space_of(threadgroup const float*) { return 3; }

template <class T> int space_of_ref(device T&) { return 1; }
template <class T> int space_of_ref(threadgroup T&) { return 3; }
template <class T> int space_of_ref(thread T&) { return 0; }

kernel void overloads(device int* out [[buffer(0)]], device float* d [[buffer(1)]], constant float* c [[buffer(2)]],
                      uint i [[thread_position_in_grid]]) {
  threadgroup float t[4];
  float local = 0;
  out[0] = space_of(&local);
  out[1] = space_of(d);
  out[2] = space_of(c);
  out[3] = space_of(t);
  out[4] = space_of_ref(d[0]);
  out[5] = space_of_ref(t[0]);
  out[6] = space_of_ref(local);
}

// A pointer-taking helper written once, for any address space.
template <class P> float sum4(P p) { return p[0] + p[1] + p[2] + p[3]; }

kernel void half_values(device half* h [[buffer(0)]], device bfloat* b [[buffer(1)]],
                        constant half* ch [[buffer(2)]], device float* out [[buffer(3)]],
                        uint i [[thread_position_in_grid]], uint lid [[thread_position_in_threadgroup]]) {
  threadgroup half th[32];
  threadgroup bfloat tb[32];
  th[lid] = h[i];                    // device -> threadgroup
  tb[lid] = b[i];
  th[lid] += ch[0];                  // compound from constant
  tb[lid] *= 2;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  half x = th[lid];                  // copy out of threadgroup
  float y = tb[lid];                 // conversion in threadgroup
  h[i] = x * ch[1] - th[lid];        // arithmetic on mixed spaces
  b[i] = -tb[lid];
  b[i] -= 1.0f;
  out[i] = y + float(ch[0]) + max(th[lid], ch[1]) + abs(h[i]);
}

kernel void vector_values(device float4* v [[buffer(0)]], device packed_float3* p [[buffer(1)]],
                          constant half4* c [[buffer(2)]], device half2* out [[buffer(3)]],
                          uint i [[thread_position_in_grid]], uint lid [[thread_position_in_threadgroup]]) {
  threadgroup float4 tv[32];
  threadgroup packed_float3 tp[32];
  tv[lid] = v[i];
  tp[lid] = p[i];
  tv[lid].xy = tv[lid].yx;           // swizzle read and write in threadgroup memory
  tv[lid] += float4(c[0]);
  tv[lid][3] = dot(tv[lid], v[i]);
  tp[lid] *= 2.0f;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  v[i].zw = tv[lid].wz;              // swizzles from threadgroup into device
  v[i] = v[i] + sqrt(abs(tv[lid])) + float4(tp[lid], 1.0f);
  v[i].x -= p[i].y;
  p[i] = float3(tv[lid].xyz) - p[i];
  p[i][2] = c[0].w;
  out[i] = half2(c[0].xy) + half2(v[i].zx);
  out[i] = select(out[i], -out[i], c[0].zy > half2(0));
}

kernel void atomic_values(device atomic_uint* counts [[buffer(0)]], device atomic_float* total [[buffer(1)]],
                          device const uint* x [[buffer(2)]], device uint* out [[buffer(3)]],
                          uint i [[thread_position_in_grid]], uint lid [[thread_position_in_threadgroup]],
                          uint group [[threadgroup_position_in_grid]]) {
  threadgroup atomic_uint local[4];
  if (lid < 4) atomic_store_explicit(&local[lid], 0u, memory_order_relaxed);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  atomic_fetch_add_explicit(&local[x[i] % 4], 1u, memory_order_relaxed);
  atomic_fetch_max_explicit(&counts[4], x[i], memory_order_relaxed);
  atomic_fetch_add_explicit(total, float(x[i]), memory_order_relaxed);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (lid < 4) {
    const uint n = atomic_load_explicit(&local[lid], memory_order_relaxed);
    atomic_fetch_add_explicit(&counts[lid], n, memory_order_relaxed);
    out[group * 4 + lid] = n;
  }
}

// One SIMD group: C = A * B with A from device memory and B staged in threadgroup memory.
kernel void matrix_values(device const half* a [[buffer(0)]], device const float* b [[buffer(1)]],
                          device float* c [[buffer(2)]], uint lid [[thread_position_in_threadgroup]]) {
  threadgroup float tb[64];
  threadgroup float tc[64];
  for (uint k = lid; k < 64; k += 32) tb[k] = b[k];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  simdgroup_half8x8 ma;
  simdgroup_float8x8 mb, mc;
  simdgroup_load(ma, a);
  simdgroup_load(mb, tb, 8, ulong2(0, 0), true);
  simdgroup_multiply(mc, ma, mb);
  simdgroup_store(mc, tc);
  simdgroup_barrier(mem_flags::mem_threadgroup);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (uint k = lid; k < 64; k += 32) c[k] = tc[k] + sum4(tc) - sum4(b);
}

// Program-scope constants in the constant address space.
constant float kScale = 2.0f;
constant constexpr int kLanes = 4;
constant float kTable[kLanes] = {1, 2, 3, 4};
constant half4 kHalves = half4(0.5h, 1.5h, 2.5h, 3.5h);
struct Offsets {
  int lane;
  float shift;
};
constant Offsets kOffsets = {1, 0.25f};

kernel void constant_values(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  constant float* table = kTable;
  float lanes[kLanes * 2];
  for (int j = 0; j < kLanes * 2; ++j) lanes[j] = table[j % kLanes] * kScale;
  out[i] = lanes[(i + kOffsets.lane) % (kLanes * 2)] + kOffsets.shift + kHalves[i % kLanes];
}
