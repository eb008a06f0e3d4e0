"""mps_ext.trace(): records kernels from both backends' dispatch paths, nests,
and keeps traces open on several threads apart."""

import threading

import torch

import mps_ext


def test_records_op_and_compile_shader_kernels():
    lib = mps_ext.sim.compile_shader("""
#include <metal_stdlib>
kernel void fill(device float* x [[buffer(0)]], uint i [[thread_position_in_grid]]) { x[i] = 1.0f; }""", name="fill")
    x = torch.zeros(100)
    with mps_ext.trace() as t:
        mps_ext.softmax(torch.randn(3, 50), -1)
        lib.fill(x, group_size=32)
    assert t.kernels == [
        mps_ext.KernelRecord("softmax_simd_float_float", (1, 1, 1), (256, 1, 1), "simulator"),
        mps_ext.KernelRecord("fill", (4, 1, 1), (32, 1, 1), "simulator"),
    ]


def test_nested_and_interleaved_traces():
    outer = mps_ext.trace()
    with outer:
        mps_ext.softmax(torch.randn(2, 8), -1)
        with mps_ext.trace() as inner:
            mps_ext.log_softmax(torch.randn(2, 8), -1)
    assert inner.names == ["log_softmax_simd_float_float"]
    assert outer.names == ["softmax_simd_float_float", "log_softmax_simd_float_float"]
    a, b = mps_ext.trace(), mps_ext.trace()
    a.__enter__()
    b.__enter__()
    a.__exit__(None, None, None)  # closed before the trace opened after it
    mps_ext.softmax(torch.randn(2, 8), -1)
    b.__exit__(None, None, None)
    assert a.kernels == [] and b.names == ["softmax_simd_float_float"]


def test_traces_on_two_threads():
    results = {}
    barrier = threading.Barrier(2)

    def work(name, cols):
        with mps_ext.trace() as t:
            barrier.wait()
            mps_ext.softmax(torch.randn(1, cols), -1)
            barrier.wait()
        results[name] = t.names

    threads = [threading.Thread(target=work, args=("short", 10)), threading.Thread(target=work, args=("long", 9000))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    # Each trace holds both threads' kernels (traces see every thread), and
    # each got its own record list back.
    for names in results.values():
        assert "softmax_simd_float_float" in names and "softmax_finalize_float_float" in names
