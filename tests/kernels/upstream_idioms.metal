// MSL as MLX's own .metal files and other code bases write it, which the
// simulator once rejected: a thread limit computed from a kernel template's
// parameters, a `namespace detail` of the file's own beside `using namespace
// metal;`, assert, half constants initialized from another or from floats, and structs
// (program-scope and local to a function) copied out of and into device and
// threadgroup memory.
#include <metal_stdlib>
using namespace metal;

namespace detail {
inline float twice(float x) { return 2 * x; }
}  // namespace detail

constant constexpr half kOne = 1.0h;
struct Offsets {
  static constexpr constant half kTwo = kOne * 2;
};

template <typename T, short THREADS>
[[kernel, max_total_threads_per_threadgroup(THREADS * 2)]] void scaled(
    device const float* x [[buffer(0)]], device T* out [[buffer(1)]], constant uint& n [[buffer(2)]],
    uint i [[thread_position_in_grid]]) {
  assert(i < n);
  out[i] = T(detail::twice(x[i])) + T(Offsets::kTwo);
}
template [[host_name("scaled_float")]] [[kernel]] decltype(scaled<float, 32>) scaled<float, 32>;
template [[host_name("scaled_half")]] [[kernel]] decltype(scaled<half, 16>) scaled<half, 16>;

struct Item {
  float4 v;
  float scale;
};

kernel void items(device const Item* in [[buffer(0)]], device Item* out [[buffer(1)]],
                  uint i [[thread_position_in_grid]]) {
  Item item = in[i];
  item.v *= item.scale;
  out[i] = item;
}

template <typename T>
void cells(device const T* in, device T* out, threadgroup void* scratch, uint i, uint lid) {
  struct Cell {
    T value;
    T total;
  };
  device const Cell* src = (device const Cell*)in;
  threadgroup Cell* staged = (threadgroup Cell*)scratch;
  Cell c = src[i];
  c.total += c.value;
  staged[lid] = c;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  Cell back;
  back = staged[lid ^ 1];
  ((device Cell*)out)[i] = back;
}

kernel void local_structs(device const float* in [[buffer(0)]], device float* out [[buffer(1)]],
                          uint i [[thread_position_in_grid]], uint lid [[thread_position_in_threadgroup]]) {
  threadgroup float scratch[2 * 64];
  cells(in, out, scratch, i, lid);
}

// fp4-fp8-for-torch-mps's decode tables: floats (NAN too) initializing constant half.
constant half kTable[2][3] = {{0.5f, 1.5h, NAN}, {-2, 65504.0f, 1e-7f}};

kernel void table(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  out[i] = kTable[i / 3][i % 3];
}
