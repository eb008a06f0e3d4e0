"""The simulator's execution model: threadgroup memory and barriers, grids
(uniform and non-uniform) and their attributes, atomics, simdgroup matrices,
and dispatch validation."""

import struct
import subprocess
import sys
import textwrap

import pytest
import torch

import mps_ext.sim
from mps_ext.sim import SimulatorError

HEADER = "#include <metal_stdlib>\nusing namespace metal;\n"


def test_barrier_orders_threadgroup_memory(shader):
    # Every thread reads the slot its mirror thread wrote before the barrier.
    lib = shader(HEADER + """
kernel void reverse(device const float* x [[buffer(0)]], device float* y [[buffer(1)]],
                    uint i [[thread_position_in_grid]], uint t [[thread_position_in_threadgroup]],
                    uint n [[threads_per_threadgroup]]) {
  threadgroup float tile[1024];
  tile[t] = x[i];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  y[i] = tile[n - 1 - t];
}""", name="reverse")
    x = torch.arange(3 * 1024, dtype=torch.float32)
    y = torch.empty_like(x)
    with mps_ext.sim.checked():
        lib.reverse(x, y, threads=x.numel(), group_size=1024)
    assert torch.equal(y, x.view(3, 1024).flip(1).flatten())


def test_threadgroup_memory_is_per_threadgroup_and_poisoned(shader):
    lib = shader(HEADER + """
struct Pair { float a; uint b; };
kernel void probe(device float* unwritten [[buffer(0)]], device uint* sums [[buffer(1)]],
                  uint g [[threadgroup_position_in_grid]], uint t [[thread_position_in_threadgroup]]) {
  threadgroup float never_written[4];
  threadgroup Pair pairs[2][64];
  threadgroup atomic_uint total;
  if (t == 0) {
    unwritten[g] = never_written[g % 4];  // poison: all bits set, a NaN
    atomic_store_explicit(&total, 0u, memory_order_relaxed);
  }
  pairs[t % 2][t].b = g * 1000 + t;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  atomic_fetch_add_explicit(&total, pairs[t % 2][t].b, memory_order_relaxed);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (t == 0) sums[g] = atomic_load_explicit(&total, memory_order_relaxed);
}""", name="tgprobe")
    unwritten, sums = torch.zeros(5), torch.zeros(5, dtype=torch.int32)
    lib.probe(unwritten, sums, threads=5 * 64, group_size=64)
    assert unwritten.isnan().all()
    assert sums.tolist() == [g * 1000 * 64 + sum(range(64)) for g in range(5)]


def test_dynamic_threadgroup_memory(shader):
    lib = shader(HEADER + """
kernel void rotate(device const int* x [[buffer(0)]], device int* y [[buffer(1)]],
                   threadgroup int* scratch [[threadgroup(0)]], threadgroup int* more [[threadgroup(1)]],
                   uint i [[thread_position_in_grid]], uint t [[thread_position_in_threadgroup]],
                   uint n [[threads_per_threadgroup]]) {
  scratch[t] = x[i];
  more[t] = 1;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  y[i] = scratch[(t + 1) % n] + more[(t + 5) % n];
}""", name="dyntg")
    x = torch.arange(256, dtype=torch.int32)
    y = torch.empty_like(x)
    lib.rotate(x, y, threads=256, group_size=64, threadgroup_memory={0: 64 * 4, 1: 64 * 4})
    assert torch.equal(y, x.view(4, 64).roll(-1, 1).flatten() + 1)
    with pytest.raises(SimulatorError, match="threadgroup\\(1\\)"):
        lib.rotate(x, y, threads=256, group_size=64, threadgroup_memory={0: 64 * 4})
    with pytest.raises(SimulatorError, match="multiple of 16"):
        lib.rotate(x, y, threads=256, group_size=64, threadgroup_memory={0: 100, 1: 256})


ATTRIBUTES = """
kernel void attrs(device uint* out [[buffer(0)]], uint2 gid [[thread_position_in_grid]],
                  uint2 tid [[thread_position_in_threadgroup]], uint2 group [[threadgroup_position_in_grid]],
                  uint2 tpt [[threads_per_threadgroup]], uint2 dtpt [[dispatch_threads_per_threadgroup]],
                  uint2 groups [[threadgroups_per_grid]], uint2 grid [[threads_per_grid]],
                  uint index [[thread_index_in_threadgroup]], ushort lane [[thread_index_in_simdgroup]],
                  ushort sg [[simdgroup_index_in_threadgroup]], ushort sgs [[simdgroups_per_threadgroup]],
                  ushort width [[threads_per_simdgroup]], uint quad_lane [[thread_index_in_quadgroup]]) {
  device uint* o = out + (gid.y * grid.x + gid.x) * 16;
  const uint v[16] = {gid.x, gid.y, tid.x, tid.y, group.x, group.y, tpt.x, tpt.y, dtpt.x, dtpt.y,
                      groups.x, groups.y, index, uint(lane) | uint(sg) << 8, sgs, width | quad_lane << 8};
  for (uint k = 0; k < 16; ++k) o[k] = v[k];
}"""


@pytest.mark.parametrize("uniform", [False, True])
def test_grid_attributes(shader, uniform):
    lib = shader(HEADER + ATTRIBUTES, name="attrs")
    gx, gy, tx, ty = (37, 5, 8, 4) if not uniform else (5, 2, 8, 4)
    grid_threads = (gx, gy) if not uniform else (gx * tx, gy * ty)
    out = torch.full((grid_threads[0] * grid_threads[1] * 16,), 0xFFFF, dtype=torch.int32)
    buffers = [out]
    mps_ext.sim.dispatch(lib, "attrs", buffers, (gx, gy, 1), (tx, ty, 1), grid_in_threads=not uniform)
    out = out.view(grid_threads[1], grid_threads[0], 16)
    groups = (-(-grid_threads[0] // tx), -(-grid_threads[1] // ty))
    for y in range(grid_threads[1]):
        for x in range(grid_threads[0]):
            gxp, gyp = x // tx, y // ty
            size = (min(tx, grid_threads[0] - gxp * tx), min(ty, grid_threads[1] - gyp * ty))
            index = (x % tx) + (y % ty) * size[0]
            want = [x, y, x % tx, y % ty, gxp, gyp, size[0], size[1], tx, ty, groups[0], groups[1], index,
                    (index % 32) | (index // 32) << 8, -(-size[0] * size[1] // 32), 32 | (index % 4) << 8]
            assert out[y, x].tolist() == want, (x, y)


def test_partial_threadgroups_run_only_existing_threads(shader):
    lib = shader(HEADER + """
kernel void count(device atomic_uint* n [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  atomic_fetch_add_explicit(n, 1u, memory_order_relaxed);
}""", name="count")
    n = torch.zeros(1, dtype=torch.int32)
    lib.count(n, threads=1000, group_size=256)  # 4 threadgroups, the last with 232 threads
    assert n.item() == 1000


def test_atomics(shader):
    lib = shader(HEADER + """
kernel void atomics(device atomic_int* counter [[buffer(0)]], device atomic_float* total [[buffer(1)]],
                    device atomic_int* maxi [[buffer(2)]], device atomic_uint* bits [[buffer(3)]],
                    device atomic_int* cas [[buffer(4)]], uint i [[thread_position_in_grid]]) {
  atomic_fetch_add_explicit(counter, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(total, 0.5f, memory_order_relaxed);
  atomic_fetch_max_explicit(maxi, int(i % 777) - 100, memory_order_relaxed);
  atomic_fetch_or_explicit(bits, 1u << (i % 32), memory_order_relaxed);
  int expected = atomic_load_explicit(cas, memory_order_relaxed);
  while (!atomic_compare_exchange_weak_explicit(cas, &expected, expected + 2, memory_order_relaxed,
                                                memory_order_relaxed)) {
  }
}""", name="atomics")
    counter, total, maxi, bits, cas = (torch.zeros(1, dtype=torch.int32), torch.zeros(1),
                                       torch.full((1,), -1000, dtype=torch.int32),
                                       torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32))
    lib.atomics(counter, total, maxi, bits, cas, threads=10000, group_size=128)
    assert counter.item() == 10000 and total.item() == 5000.0 and maxi.item() == 676
    assert bits.item() == -1 and cas.item() == 20000


def test_spin_wait_on_another_simdgroup(shader):
    # Thread 0 spins until a thread of another SIMD group sets a flag: the
    # waiting thread must yield for the other to run.
    lib = shader(HEADER + """
kernel void handoff(device int* out [[buffer(0)]], uint t [[thread_position_in_threadgroup]]) {
  threadgroup atomic_int flag;
  if (t == 0) atomic_store_explicit(&flag, 0, memory_order_relaxed);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (t == 0) {
    while (atomic_load_explicit(&flag, memory_order_relaxed) == 0) {}
    out[0] = atomic_load_explicit(&flag, memory_order_relaxed);
  } else if (t == 40) {
    atomic_store_explicit(&flag, 42, memory_order_relaxed);
  }
}""", name="handoff")
    out = torch.zeros(1, dtype=torch.int32)
    lib.handoff(out, threads=64, group_size=64)
    assert out.item() == 42


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_simdgroup_matrix_gemm(shader, dtype):
    t = {torch.float32: "float", torch.float16: "half", torch.bfloat16: "bfloat"}[dtype]
    lib = shader(HEADER + f"""
// C (M x N, float) = A (M x K) B (K x N), or A^T B when `ta`: one SIMD group per 8x8 tile of C.
kernel void gemm(device const {t}* a [[buffer(0)]], device const {t}* b [[buffer(1)]], device float* c [[buffer(2)]],
                 constant uint3& mnk [[buffer(3)]], constant uint& ta [[buffer(4)]],
                 uint2 tile [[threadgroup_position_in_grid]]) {{
  simdgroup_float8x8 acc = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
  for (uint k = 0; k < mnk.z; k += 8) {{
    simdgroup_matrix<{t}, 8, 8> ma, mb;
    if (ta) simdgroup_load(ma, a, mnk.x, ulong2(tile.y * 8, k), true);
    else simdgroup_load(ma, a, mnk.z, ulong2(k, tile.y * 8));
    simdgroup_load(mb, b, mnk.y, ulong2(tile.x * 8, k));
    simdgroup_multiply_accumulate(acc, ma, mb, acc);
  }}
  simdgroup_store(acc, c, mnk.y, ulong2(tile.x * 8, tile.y * 8));
}}""", name=f"gemm_{t}")
    m, n, k = 24, 40, 16
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(m, k, generator=g).to(dtype), torch.randn(k, n, generator=g).to(dtype)
    for transpose in (False, True):
        src = a.t().contiguous() if transpose else a
        c = torch.zeros(m, n)
        lib.gemm(src, b, c, struct.pack("<IIII", m, n, k, 0), int(transpose), arg_casts={4: "int32"},
                 threads=(n // 8 * 32, m // 8), group_size=(32, 1))
        torch.testing.assert_close(c, a.float() @ b.float(), rtol=1e-5, atol=1e-5)


def test_max_total_threads_attribute_and_limits(shader):
    lib = shader(HEADER + """
[[max_total_threads_per_threadgroup(64)]]
kernel void small(device float* x [[buffer(0)]], uint i [[thread_position_in_grid]]) { x[i] = 1.0f; }
""", name="limits")
    x = torch.zeros(256)
    lib.small(x, group_size=64)
    assert (x == 1).all()
    with pytest.raises(SimulatorError, match="max_total_threads_per_threadgroup\\(64\\)"):
        lib.small(x, group_size=128)
    assert lib.small.max_threads_per_threadgroup == 64
    with pytest.raises(SimulatorError, match="1024"):
        mps_ext.sim.dispatch(lib, "small", [x], (2048, 1, 1), (32, 33, 1))


def test_binding_errors(shader):
    lib = shader(HEADER + """
struct Params { float4 scale; uint n; };
kernel void scale(device float* x [[buffer(0)]], constant Params& p [[buffer(2)]],
                  uint i [[thread_position_in_grid]]) { if (i < p.n) x[i] *= p.scale.x; }
""", name="binding")
    x = torch.ones(8)
    with pytest.raises(SimulatorError, match=r"\[\[buffer\(2\)\]\] is not bound"):
        lib.scale(x)
    with pytest.raises(SimulatorError, match=r"\[\[buffer\(2\)\]\] is bound to fewer bytes"):
        lib.scale(x, 1.0, 3)  # 8 bytes where Params needs 32
    lib.scale(x, 0.0, struct.pack("<4fI12x", 3.0, 0, 0, 0, 5))
    assert x.tolist() == [3.0] * 5 + [1.0] * 3


def test_results_do_not_depend_on_worker_count(tmp_path):
    # Each threadgroup runs on one worker in a fixed order, so a float
    # reduction gives the same bits with 1 or 2 workers.
    script = textwrap.dedent("""
        import sys, torch, mps_ext.sim
        from pathlib import Path
        lib = mps_ext.sim.compile_file(Path(mps_ext.sim.__file__).with_name("selfcheck.metal"))
        x = torch.randn(100000, generator=torch.Generator().manual_seed(0))
        sums = torch.zeros(98)
        lib.block_sum(x, sums, 100000, arg_casts={2: "int32"}, threads=98 * 1024, group_size=1024)
        sys.stdout.write(sums.numpy().tobytes().hex())
    """)
    outputs = []
    for threads in ("1", "2"):
        env = {**__import__("os").environ, "MPS_EXT_SIM_THREADS": threads}
        outputs.append(subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                                      check=True).stdout)
    assert outputs[0] == outputs[1]


SIMDGROUP_EXCHANGE = HEADER + """
// Each lane reads the slot its neighbour in the same SIMD group wrote.
kernel void exchange(device const float* x [[buffer(0)]], device float* y [[buffer(1)]],
                     uint i [[thread_position_in_grid]], uint t [[thread_position_in_threadgroup]],
                     uint lane [[thread_index_in_simdgroup]]) {
  threadgroup float slots[128];
  slots[t] = x[i];
  SYNC;
  y[i] = slots[t - lane + (lane + 1) % 32];
}"""


def test_simdgroup_barrier_orders_a_simd_group(shader):
    x = torch.arange(256, dtype=torch.float32)
    want = x.view(-1, 32).roll(-1, 1).flatten()
    lib = shader(SIMDGROUP_EXCHANGE.replace("SYNC", "simdgroup_barrier(mem_flags::mem_threadgroup)"), name="sgbar")
    y = torch.empty_like(x)
    with mps_ext.sim.checked():
        lib.exchange(x, y, group_size=128)
    assert torch.equal(y, want)
    racy = shader(SIMDGROUP_EXCHANGE.replace("SYNC", "(void)0"), name="sgbar_missing")
    with mps_ext.sim.checked(), pytest.raises(SimulatorError, match="not deterministic"):
        racy.exchange(x, y, group_size=128)
