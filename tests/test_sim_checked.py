"""Checked mode catches the planted bugs of tests/kernels/planted_bugs.metal
and passes their correct twins without a false alarm."""

import platform
import re

import pytest
import torch

import mps_ext.sim
from mps_ext.sim import DivergenceWarning, SimulatorError


@pytest.fixture(scope="module")
def bugs(kernels):
    return kernels("planted_bugs")


def line_of(text: str) -> int:
    """The planted_bugs.metal line holding `text`."""
    from conftest import KERNELS

    lines = (KERNELS / "planted_bugs.metal").read_text().splitlines()
    return next(n for n, line in enumerate(lines, 1) if text in line)


def test_missing_barrier_is_a_race(bugs):
    x = torch.arange(512, dtype=torch.float32)
    y = torch.empty_like(x)
    with mps_ext.sim.checked(), pytest.raises(SimulatorError, match="reverse_missing_barrier.*not deterministic"):
        bugs.reverse_missing_barrier(x, y, group_size=256)


def test_barrier_passes(bugs):
    x = torch.arange(512, dtype=torch.float32)
    y = torch.empty_like(x)
    with mps_ext.sim.checked():
        bugs.reverse_with_barrier(x, y, group_size=256)
    assert torch.equal(y, x.view(2, 256).flip(1).flatten())


def test_divergent_simd_sum_is_reported(bugs):
    x = torch.arange(64, dtype=torch.float32)
    y = torch.empty_like(x)
    with pytest.warns(DivergenceWarning, match=f"planted_bugs.metal:{line_of('v = simd_sum(v)')}"):
        bugs.divergent_simd_sum(x, y, group_size=64)
    # The GPU's answer: each branch reduces over the lanes that took it.
    lanes = x.view(2, 32)
    even, odd = lanes[:, 0::2].sum(1), lanes[:, 1::2].max(1).values
    want = torch.stack([even.repeat_interleave(16), odd.repeat_interleave(16)], 1).view(2, 32)
    assert torch.equal(y.view(2, 32)[:, 0::2], want[:, 0::2]) and torch.equal(y.view(2, 32)[:, 1::2], want[:, 1::2])


def test_uniform_simd_functions_pass(bugs):
    x = torch.randn(64)
    y = torch.empty_like(x)
    with mps_ext.sim.checked():
        bugs.uniform_simd_sum(x, y, group_size=64)  # any DivergenceWarning is an error (pyproject)
    sums, maxes = x.view(2, 32).sum(1), x.view(2, 32).max(1).values
    want = torch.where(torch.arange(64) % 2 == 0, sums.repeat_interleave(32), maxes.repeat_interleave(32))
    torch.testing.assert_close(y, want)


def test_out_of_bounds_write_from_rounded_up_grid(bugs):
    x, y = torch.randn(1000), torch.zeros(1000)
    line = line_of("y[i] = 2.0f * x[i];")
    with mps_ext.sim.checked(), pytest.raises(SimulatorError) as e:
        mps_ext.sim.dispatch(bugs, "scale_unchecked", [x, y], (4, 1, 1), (256, 1, 1), grid_in_threads=False)
    message = str(e.value)
    # The read of x[1000] faults first: it comes before the write.
    assert re.search(r"out-of-bounds read of buffer\(0\) at byte offset 4000 \(the buffer holds 4000 bytes\)",
                     message), message
    assert "thread (1000, 0, 0)" in message and f"planted_bugs.metal:{line}" in message
    assert torch.equal(y, torch.zeros(1000)), "a failed checked dispatch leaves the buffers untouched"


def test_out_of_bounds_write_is_named(bugs):
    y = torch.zeros(1000)
    with mps_ext.sim.checked(), pytest.raises(SimulatorError, match=r"out-of-bounds write of buffer\(0\) at byte "
                                                                    r"offset 4000.*thread \(1000, 0, 0\)"):
        bugs.write_one_past(y, 1000, arg_casts="int32", threads=1024, group_size=256)


def test_off_by_one_write_into_alignment_slack(bugs):
    y = torch.zeros(1001)  # 4004 bytes: the end is not 16-byte aligned, 12 bytes of canary follow it
    with mps_ext.sim.checked(), pytest.raises(SimulatorError, match=r"buffer\(0\) at byte offset 4004"):
        bugs.write_one_past(y, 1001, arg_casts="int32", threads=1024, group_size=256)


def test_bounds_checked_kernel_passes(bugs):
    x, y = torch.randn(1000), torch.zeros(1000)
    with mps_ext.sim.checked():
        mps_ext.sim.dispatch(bugs, "scale_checked", [x, y, (1000).to_bytes(4, "little")], (4, 1, 1), (256, 1, 1),
                             grid_in_threads=False)
    torch.testing.assert_close(y, 2 * x)


def test_threadgroup_memory_over_limit(bugs):
    y = torch.zeros(32)
    with pytest.raises(SimulatorError, match=r"exceeds Metal's limit of 32768 bytes.*planted_bugs.metal:"
                                             f"{line_of('threadgroup float big[9000]')}"):
        bugs.threadgroup_too_big(y, group_size=32)


def test_threadgroup_memory_at_limit_passes(bugs):
    y = torch.zeros(32)
    with mps_ext.sim.checked():
        bugs.threadgroup_at_limit(y, group_size=32)
    assert y.tolist() == [float(8191 - t) for t in range(32)]


def test_barrier_after_early_return_is_reported(bugs):
    y = torch.zeros(64)
    with pytest.warns(DivergenceWarning, match="returned"):
        bugs.barrier_after_return(y, 40, arg_casts="int32", threads=64, group_size=64)


def test_stack_overflow(bugs):
    y = torch.zeros(4)
    with pytest.raises(SimulatorError, match="stack overflow.*huge_local_array"):
        bugs.huge_local_array(y)


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"),
                    reason="only x86 CPUs trap on integer division by zero (arm64 returns 0, like the GPU)")
def test_integer_division_by_zero(bugs):
    y = torch.zeros(4, dtype=torch.int32)
    with pytest.raises(SimulatorError, match="integer division by zero.*divide_by_zero"):
        bugs.divide_by_zero(y, 0, arg_casts="int32")


def test_process_survives_faults(bugs):
    # A fault in a kernel aborts that dispatch only: kernels run normally after it.
    y = torch.zeros(4)
    with pytest.raises(SimulatorError, match="stack overflow"):
        bugs.huge_local_array(y)
    x = torch.arange(512, dtype=torch.float32)
    y = torch.empty_like(x)
    bugs.reverse_with_barrier(x, y, group_size=256)
    assert torch.equal(y, x.view(2, 256).flip(1).flatten())


HEADER = "#include <metal_stdlib>\nusing namespace metal;\n"


def test_misaligned_vector_loads_are_errors(bugs):
    x, y = torch.arange(40, dtype=torch.float32), torch.zeros(8, 4)
    line = line_of("reinterpret_cast<device const float4*>(x + 1)")
    with pytest.raises(SimulatorError, match=rf"misaligned reinterpret_cast: the type needs 16-byte alignment, "
                                             rf"the address is 4 bytes past it.*planted_bugs.metal:{line}"):
        bugs.misaligned_vector_load(x, y, threads=8)
    bugs.aligned_vector_load(x, y, threads=8)
    assert torch.equal(y.flatten(), x[4:36])


def test_aliased_buffers_stay_aliased(shader):
    # The same tensor bound twice, and overlapping views, share memory in
    # checked mode too: a kernel updating in place sees its own writes.
    lib = shader(HEADER + """
kernel void inc(device const float* in [[buffer(0)]], device float* out [[buffer(1)]],
                uint i [[thread_position_in_grid]]) { out[i] = in[i] + 1.0f; }""", name="alias")
    x = torch.zeros(64)
    with mps_ext.sim.checked():
        lib.inc(x, x)
    assert (x == 1).all()
    y = torch.arange(16.0)
    with mps_ext.sim.checked():
        lib.inc(y[8:], y[:8], threads=8)  # reads the upper half, writes the lower
    assert y.tolist() == [float(v) for v in range(9, 17)] + [float(v) for v in range(8, 16)]


def test_order_dependent_kernels_can_skip_the_schedule_comparison(shader):
    # Stream compaction: which slot a value lands in depends on thread order.
    lib = shader(HEADER + """
kernel void compact(device const float* x [[buffer(0)]], device float* out [[buffer(1)]],
                    device atomic_uint* n [[buffer(2)]], uint i [[thread_position_in_grid]]) {
  if (x[i] > 0.0f) out[atomic_fetch_add_explicit(n, 1u, memory_order_relaxed)] = x[i];
}""", name="compact")
    x = torch.randn(256)
    out, n = torch.zeros(256), torch.zeros(1, dtype=torch.int32)
    with mps_ext.sim.checked(), pytest.raises(SimulatorError, match="not deterministic"):
        lib.compact(x, out, n, group_size=64)
    out.zero_(), n.zero_()
    with mps_ext.sim.checked(compare_schedules=False):
        lib.compact(x, out, n, group_size=64)
    kept = int(n.item())
    assert kept == int((x > 0).sum()) and torch.equal(out[:kept].sort().values, x[x > 0].sort().values)
    with mps_ext.sim.checked(compare_schedules=False), pytest.raises(SimulatorError, match="out-of-bounds"):
        lib.compact(x, out[:10], n, group_size=64)  # other checks stay on
