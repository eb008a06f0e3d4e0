"""The simulator's limits hold whatever the caller does: bad launch arguments, kernels that write out of
bounds or never finish, many CPUs, big stacks, signals, fork. Each ends in a Python error, never in a
crash, a hang or a corrupted process."""

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch
from conftest import run_python

import mps_ext
import mps_ext.sim
from mps_ext.sim import SimulatorError

SOURCE = """
#include <metal_stdlib>
using namespace metal;
kernel void fill(device float* x [[buffer(0)]], constant float& v [[buffer(1)]],
                 uint i [[thread_position_in_grid]]) {
  x[i] = v;
}
kernel void fill_far(device float* x [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  x[i + 100000] = 1.0f;
}
// Runs for ever: (2^32 - 1)^2 iterations that the compiler cannot drop.
kernel void forever(device float* x [[buffer(0)]], constant uint& n [[buffer(1)]],
                    uint i [[thread_position_in_grid]]) {
  float acc = 0.0f;
  for (uint a = 0; a < n; ++a)
    for (uint b = 0; b < n; ++b) acc = acc * 0.5f + x[b & 3];
  x[i] = acc;
}
// Thread 0 writes far out of bounds; the others run for ever.
kernel void fault_or_forever(device float* x [[buffer(0)]], constant uint& n [[buffer(1)]],
                             uint i [[thread_position_in_grid]]) {
  if (i == 0) {
    x[1 << 20] = 1.0f;
    return;
  }
  float acc = 0.0f;
  for (uint a = 0; a < n; ++a)
    for (uint b = 0; b < n; ++b) acc = acc * 0.5f + x[b & 3];
  x[i] = acc;
}
kernel void tg_sum(device float* x [[buffer(0)]], threadgroup float* a [[threadgroup(0)]],
                   threadgroup float* b [[threadgroup(1)]], uint i [[thread_position_in_grid]],
                   uint t [[thread_position_in_threadgroup]]) {
  a[t] = x[i];
  b[t] = 1.0f;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  x[i] = a[t] + b[t];
}
"""

UNTIL_FOREVER = -1  # as int32: 0xFFFFFFFF iterations, twice nested


@pytest.fixture(scope="module")
def lib():
    return mps_ext.sim.compile_shader(SOURCE, name="limits")


# ---- 3: launch geometry --------------------------------------------------------------------------

@pytest.mark.parametrize("group_size", [0, (4, 0), (0, 1, 1)])
def test_zero_group_size_is_a_value_error(lib, group_size):
    threads = 16 if isinstance(group_size, int) else (16,) * len(group_size)
    with mps_ext.trace() as t, pytest.raises(ValueError, match="group_size"):
        lib.fill(torch.zeros(16 ** len(threads) if isinstance(threads, tuple) else 16), 1.0, threads=threads,
                 group_size=group_size)
    assert t.kernels == []


def test_low_level_zero_threadgroup_is_an_error(lib):
    with mps_ext.trace() as t, pytest.raises(SimulatorError, match="zero dimension"):
        mps_ext.sim.dispatch(lib, "fill", [torch.zeros(16), b"\0\0\0\0"], (16, 1, 1), (0, 1, 1))
    assert t.kernels == [], "a dispatch that failed is not recorded"


# ---- 11: threadgroup memory sizes ----------------------------------------------------------------

@pytest.mark.parametrize("memory, match", [
    ({0: 2 ** 64 - 16, 1: 256}, "threadgroup_memory"),
    ({0: 2 ** 63, 1: 2 ** 63}, "threadgroup_memory"),
    ({31: 256}, r"index 31.*0 to 30"),
    ({-1: 256}, r"index -1.*0 to 30"),
    ({0: -16}, "threadgroup_memory"),
    ({0: 33 * 1024}, "32768"),
    ({"0": 256}, "threadgroup_memory"),
])
def test_threadgroup_memory_out_of_range_is_a_value_error(lib, memory, match):
    x = torch.zeros(32)
    with pytest.raises(TypeError if "0" in memory else ValueError, match=match):
        lib.tg_sum(x, threadgroup_memory=memory, group_size=32)


def test_threadgroup_memory_in_range_runs(lib):
    x = torch.arange(64.0)
    lib.tg_sum(x, threadgroup_memory={0: 128, 1: 128}, group_size=32)
    assert torch.equal(x, torch.arange(64.0) + 1)


def test_low_level_threadgroup_lengths_cannot_wrap(lib):
    with pytest.raises(SimulatorError, match="threadgroup memory"):
        mps_ext.sim.dispatch(lib, "tg_sum", [torch.zeros(32)], (32, 1, 1), (32, 1, 1), [2 ** 64 - 16, 256])


# ---- 5: out-of-bounds accesses in the default mode -----------------------------------------------

def test_out_of_bounds_write_in_default_mode_is_an_error(lib):
    x = torch.zeros(16)
    with pytest.raises(SimulatorError, match=r"out-of-bounds write of buffer\(0\) at byte offset 64 .*limits-"):
        lib.fill(x, 7.0, threads=64)
    # Writes past the end went to a copy: the process and the tensor are intact.
    assert torch.equal(x, torch.zeros(16))
    lib.fill(x, 7.0)
    assert torch.equal(x, torch.full((16,), 7.0))


def test_write_through_empty_tensor_is_an_error(lib):
    with pytest.raises(SimulatorError, match=r"out-of-bounds write of buffer\(0\) .*holds 0 bytes"):
        lib.fill(torch.zeros(0), 7.0, threads=4)
    x = torch.randn(8, 300)
    torch.testing.assert_close(mps_ext.softmax(x, -1), torch.softmax(x, -1))


def test_far_out_of_bounds_write_is_not_silent(lib):
    # Far past the guard page: the copy's mapping still ends there, so it faults rather than landing in the heap.
    with pytest.raises(SimulatorError, match="invalid memory write|out-of-bounds write"):
        lib.fill_far(torch.zeros(16))


def test_default_mode_writes_results_back_through_views(lib):
    base = torch.zeros(40)
    lib.fill(base[3:19], 2.0)
    assert torch.equal(base, torch.cat([torch.zeros(3), torch.full((16,), 2.0), torch.zeros(21)]))


# ---- 6: timeouts and interrupts -------------------------------------------------------------------

def test_checked_timeout_stops_a_kernel_that_never_finishes(lib):
    x = torch.ones(4)
    start = time.monotonic()
    with mps_ext.sim.checked(timeout=0.3), pytest.raises(SimulatorError, match=r"forever.*timed out after 0.3"):
        lib.forever(x, UNTIL_FOREVER, arg_casts="int32", threads=64, group_size=32)
    assert time.monotonic() - start < 10
    assert torch.equal(x, torch.ones(4))
    lib.fill(x, 3.0)  # the simulator is usable again
    assert torch.equal(x, torch.full((4,), 3.0))


def test_a_fault_stops_the_other_workers(lib):
    # Every threadgroup but the first runs for ever: the fault must end the dispatch without a timeout.
    with pytest.raises(SimulatorError, match=r"out-of-bounds write of buffer\(0\) at byte offset 4194304"):
        lib.fault_or_forever(torch.ones(4), UNTIL_FOREVER, arg_casts="int32", threads=8, group_size=1)


def test_timeout_from_the_environment(lib, monkeypatch):
    monkeypatch.setenv("MPS_EXT_SIM_TIMEOUT", "0.2")
    with pytest.raises(SimulatorError, match=r"timed out after 0.2 s.*MPS_EXT_SIM_TIMEOUT"):
        lib.forever(torch.ones(4), UNTIL_FOREVER, arg_casts="int32", threads=4)
    monkeypatch.setenv("MPS_EXT_SIM_TIMEOUT", "soon")
    with pytest.raises(SimulatorError, match="MPS_EXT_SIM_TIMEOUT"):
        lib.fill(torch.zeros(4), 1.0)


@pytest.mark.parametrize("timeout", [0, -1.0, float("nan"), "1"])
def test_checked_timeout_must_be_positive(timeout):
    with pytest.raises((ValueError, TypeError), match="timeout"):
        with mps_ext.sim.checked(timeout=timeout):
            pass


def test_other_threads_wait_for_a_timed_out_dispatch_then_run(lib):
    results = []

    def other():
        y = torch.zeros(8)
        lib.fill(y, 5.0)
        results.append(y)

    with mps_ext.sim.checked(timeout=0.5), pytest.raises(SimulatorError, match="timed out"):
        t = threading.Thread(target=lambda: (time.sleep(0.1), other()))
        t.start()
        lib.forever(torch.ones(4), UNTIL_FOREVER, arg_casts="int32", threads=4)
    t.join(timeout=30)
    assert not t.is_alive() and torch.equal(results[0], torch.full((8,), 5.0))


def test_ctrl_c_interrupts_a_dispatch():
    code = textwrap.dedent(f"""
        import sys, torch, mps_ext.sim
        SOURCE = {SOURCE!r}
        lib = mps_ext.sim.compile_shader(SOURCE, name="limits")
        print("ready", flush=True)
        try:
            lib.forever(torch.ones(4), {UNTIL_FOREVER}, arg_casts="int32", threads=256, group_size=64)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
        x = torch.zeros(4)
        lib.fill(x, 2.0)
        print("after", x.tolist(), flush=True)
        """)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": root})
    try:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert "interrupted" in out and "after [2.0, 2.0, 2.0, 2.0]" in out, out + err


# ---- 1 and 13: worker count and stack size -------------------------------------------------------

def test_workers_and_stack_size_from_the_environment_are_validated():
    code = textwrap.dedent("""
        import os, torch, mps_ext
        from mps_ext.sim import SimulatorError
        x = torch.randn(4, 300)
        for var, value in [("MPS_EXT_SIM_THREADS", "-5"), ("MPS_EXT_SIM_THREADS", "100000"),
                           ("MPS_EXT_SIM_THREADS", "four"), ("MPS_EXT_SIM_THREADS", "0"),
                           ("MPS_EXT_SIM_STACK_KB", "2"), ("MPS_EXT_SIM_STACK_KB", "99999999")]:
            os.environ[var] = value
            try:
                mps_ext.softmax(x, -1)
            except RuntimeError as e:
                assert var in str(e) and value in str(e), str(e)
            else:
                raise AssertionError(f"{var}={value} accepted")
            del os.environ[var]
        os.environ["MPS_EXT_SIM_THREADS"] = "3"
        torch.testing.assert_close(mps_ext.softmax(x, -1), torch.softmax(x, -1))
        print("ok")
        """)
    proc = run_python(code, timeout=120)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stdout + proc.stderr


def test_many_workers_with_big_stacks_stay_within_the_mapping_limit():
    # 40 workers x 1024 stacks, each behind a guard page, would need about 82,000 mappings (Linux allows
    # 65,530 by default); 32 MiB stacks, 32 GiB of address space per worker.
    code = textwrap.dedent("""
        import torch, mps_ext
        import mps_ext.sim
        x = torch.randn(64, 5000)
        torch.testing.assert_close(mps_ext.softmax(x, -1), torch.softmax(x, -1))
        lib = mps_ext.sim.compile_shader('''
        kernel void big(device float* x [[buffer(0)]], uint i [[thread_position_in_grid]]) { x[i] += 1.0f; }''')
        y = torch.zeros(1024 * 64)
        lib.big(y, group_size=1024)
        assert torch.equal(y, torch.ones(1024 * 64))
        print("ok")
        """)
    proc = run_python(code, env={"MPS_EXT_SIM_THREADS": "40", "MPS_EXT_SIM_STACK_KB": "32768"}, timeout=300)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stdout + proc.stderr[-3000:]


# ---- 4: fault handlers chain ----------------------------------------------------------------------

def test_a_real_segfault_after_faulthandler_enable_ends_the_process():
    code = textwrap.dedent(f"""
        import ctypes, faulthandler, torch, mps_ext
        import mps_ext.sim
        SOURCE = {SOURCE!r}
        x = torch.randn(4, 300)
        mps_ext.softmax(x, -1)
        faulthandler.enable()
        mps_ext.softmax(x, -1)
        lib = mps_ext.sim.compile_shader(SOURCE, name="limits")
        try:
            lib.fill(torch.zeros(16), 1.0, threads=64)  # a GPU thread's fault is still the simulator's
        except mps_ext.sim.SimulatorError:
            print("kernel fault reported", flush=True)
        ctypes.string_at(0)
        """)
    proc = run_python(code, timeout=60)
    assert "kernel fault reported" in proc.stdout, proc.stderr
    assert proc.returncode == -signal.SIGSEGV, (proc.returncode, proc.stderr[-2000:])
    assert proc.stderr.count("Fatal Python error: Segmentation fault") == 1, proc.stderr[-2000:]
    assert "string_at" in proc.stderr  # faulthandler's traceback of the real fault


# ---- 8: fork ----------------------------------------------------------------------------------------

def test_fork_while_another_thread_dispatches_does_not_deadlock_the_child():
    code = textwrap.dedent("""
        import os, threading, time, torch, mps_ext
        import mps_ext.sim
        x = torch.randn(2, 40)
        stop = False

        def busy():
            while not stop:
                with mps_ext.trace(), mps_ext.sim.checked(compare_schedules=False):
                    mps_ext.softmax(x, -1)
                mps_ext.overrides.stats()

        threads = [threading.Thread(target=busy) for _ in range(2)]
        for t in threads:
            t.start()
        hung = 0
        for _ in range(150):
            pid = os.fork()
            if pid == 0:
                with mps_ext.trace() as t, mps_ext.sim.checked():
                    mps_ext.softmax(x, -1)
                mps_ext.overrides.stats()
                os._exit(0 if t.names else 3)
            deadline = time.monotonic() + 20
            while True:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    assert os.waitstatus_to_exitcode(status) == 0, status
                    break
                if time.monotonic() > deadline:
                    hung += 1
                    os.kill(pid, 9)
                    os.waitpid(pid, 0)
                    break
                time.sleep(0.002)
        stop = True
        for t in threads:
            t.join()
        print("hung", hung)
        """)
    proc = run_python(code, env={"MPS_EXT_SIM_THREADS": "1"}, timeout=400)
    assert proc.returncode == 0 and "hung 0" in proc.stdout, proc.stdout + proc.stderr[-3000:]


# ---- checked() across threads -----------------------------------------------------------------------

def test_checked_blocks_nest_across_threads(kernels):
    bugs = kernels("planted_bugs")
    inside, leave = threading.Event(), threading.Event()

    def other():
        with mps_ext.sim.checked(compare_schedules=False):
            inside.set()
            leave.wait(30)

    t = threading.Thread(target=other)
    t.start()
    inside.wait(30)
    x = torch.arange(512, dtype=torch.float32)
    with mps_ext.sim.checked():
        leave.set()
        t.join()
        # The other thread left its block; this thread's block still compares schedules.
        with pytest.raises(SimulatorError, match="not deterministic"):
            bugs.reverse_missing_barrier(x, torch.empty_like(x), group_size=256)
    bugs.reverse_missing_barrier(x, torch.empty_like(x), group_size=256)  # no block open: unchecked


def test_overrides_enabled_nests_across_threads():
    assert not mps_ext.overrides.is_enabled("cpu")
    inside, leave = threading.Event(), threading.Event()

    def other():
        with mps_ext.overrides.enabled("cpu"):
            inside.set()
            leave.wait(30)

    t = threading.Thread(target=other)
    t.start()
    inside.wait(30)
    with mps_ext.overrides.enabled("cpu"):
        leave.set()
        t.join()
        assert mps_ext.overrides.is_enabled("cpu"), "another thread leaving its block disabled this one's"
        x = torch.randn(3, 50)
        with mps_ext.trace() as tr:
            torch.softmax(x, -1)
        assert tr.names == ["softmax_simd_float_float"]
    assert not mps_ext.overrides.is_enabled("cpu")


# ---- traces ---------------------------------------------------------------------------------------

def test_trace_keeps_a_bounded_number_of_records(lib):
    with mps_ext.trace(max_records=3) as t:
        for _ in range(5):
            lib.fill(torch.zeros(4), 1.0)
    assert len(t.kernels) == 3 and t.dropped == 2


def test_trace_never_exited_is_closed_when_collected(lib):
    import gc

    open_before = mps_ext._C._trace_open_count()
    t = mps_ext.trace()
    t.__enter__()
    assert mps_ext._C._trace_open_count() == open_before + 1
    del t
    gc.collect()
    assert mps_ext._C._trace_open_count() == open_before
