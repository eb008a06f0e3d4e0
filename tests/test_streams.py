"""Streams and events: ordering on a stream and between streams, events,
query(), timing, the current-stream context, record_stream, errors, host reads
inside ops that wait for their kernels, and waits that Ctrl-C stops. On the
simulator a non-default stream runs its work on a thread of its own, and
mps_ext.streams.hold() stops a stream deterministically, so each ordering test
fails when the ordering is missing."""

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import weakref

import numpy as np
import pytest
import torch

import mps_ext
import mps_ext.sim
from mps_ext.streams import hold
from test_sim_limits import SOURCE as LIMITS_SOURCE
from test_sim_limits import UNTIL_FOREVER
from tolerances import assert_close, reduction_scale

SOURCE = """
#include <metal_stdlib>
using namespace metal;

kernel void fill(device float* out [[buffer(0)]], constant float& value [[buffer(1)]],
                 uint i [[thread_position_in_grid]]) {
  out[i] = value;
}

kernel void copy(device float* dst [[buffer(0)]], device const float* src [[buffer(1)]],
                 uint i [[thread_position_in_grid]]) {
  dst[i] = src[i];
}

// Appends `tag` to `log` in the order the dispatches run.
kernel void append(device atomic_uint* count [[buffer(0)]], device uint* log [[buffer(1)]],
                   constant uint& tag [[buffer(2)]], uint i [[thread_position_in_grid]]) {
  log[atomic_fetch_add_explicit(count, 1u, memory_order_relaxed)] = tag;
}

kernel void write_past_the_end(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  out[i + 1] = 1.0f;
}
"""


@pytest.fixture(scope="module")
def lib():
    return mps_ext.sim.compile_shader(SOURCE, name="streams")


def softmax_chain(x):
    return mps_ext.log_softmax(mps_ext.softmax(mps_ext.softmax(x, -1), -1), -1)


def reference_chain(x):
    return torch.log_softmax(torch.softmax(torch.softmax(x, -1), -1), -1)


# Work on one stream


def test_kernels_on_a_stream_run_in_the_order_enqueued(lib):
    s = mps_ext.Stream("cpu")
    count, log = torch.zeros(1, dtype=torch.int32), torch.full((24,), -1, dtype=torch.int32)
    with hold(s), mps_ext.stream(s):
        for tag in range(24):
            lib.append(count, log, tag, threads=1, arg_casts="int32")
        assert int(count) == 0  # nothing ran while the stream was held
    s.synchronize()
    assert log.tolist() == list(range(24))


def test_ops_follow_the_stream_and_run_later(device):
    x = torch.randn(5, 300, generator=torch.Generator().manual_seed(0))
    s = mps_ext.Stream(device)
    s.wait_stream(mps_ext.current_stream(device))
    with mps_ext.trace() as t, mps_ext.stream(s):
        y = softmax_chain(x.to(device))
    s.synchronize()
    assert_close(y.cpu(), reference_chain(x), scale=reduction_scale(torch.float32, 300, signed_terms=True))
    assert len(t.kernels) == 3 and {k.backend for k in t.kernels} == {"simulator" if device == "cpu" else "metal"}


def test_op_on_a_held_stream_returns_before_its_kernel_ran():
    x = torch.randn(4, 64)
    s = mps_ext.Stream("cpu")
    with hold(s):
        with mps_ext.stream(s):
            y = mps_ext.softmax(x, -1)
        assert not s.query()
    s.synchronize()
    assert s.query()
    assert_close(y, torch.softmax(x, -1), scale=reduction_scale(torch.float32, 64, signed_terms=False))


def test_default_stream_runs_at_once(lib):
    out = torch.zeros(8)
    with mps_ext.stream(mps_ext.default_stream("cpu")):
        lib.fill(out, 2.0)
    assert out.tolist() == [2.0] * 8
    assert mps_ext.default_stream("cpu").query()


# Events


def test_event_is_reached_only_after_the_kernel_before_it(lib):
    s, out = mps_ext.Stream("cpu"), torch.zeros(16)
    e = mps_ext.Event()
    assert e.query()  # never recorded
    with hold(s):
        with mps_ext.stream(s):
            lib.fill(out, 3.0)
        e.record(s)
        time.sleep(0.02)
        assert not e.query() and out.sum() == 0
    e.synchronize()
    assert e.query() and out.tolist() == [3.0] * 16


def test_event_on_the_current_stream(device):
    x = torch.randn(3, 1000)
    s = mps_ext.Stream(device)
    s.wait_stream(mps_ext.current_stream(device))
    with mps_ext.stream(s):
        y = mps_ext.softmax(x.to(device), -1)
        e = mps_ext.Event()
        e.record()  # on the current stream: s
        assert e.device == torch.device(device)
    e.synchronize()
    assert e.query()
    assert_close(y.cpu(), torch.softmax(x, -1), scale=reduction_scale(torch.float32, 1000, signed_terms=False))


@pytest.mark.parametrize("how", ["wait_event", "wait_stream", "event.wait"])
def test_a_stream_waits_for_the_other(lib, how):
    producer, consumer = mps_ext.Stream("cpu"), mps_ext.Stream("cpu")
    data, result = torch.zeros(64), torch.zeros(64)
    with hold(producer):
        with mps_ext.stream(producer):
            lib.fill(data, 7.0)
        if how == "wait_event":
            consumer.wait_event(producer.record_event())
        elif how == "wait_stream":
            consumer.wait_stream(producer)
        else:
            e = mps_ext.Event()
            e.record(producer)
            with mps_ext.stream(consumer):
                e.wait()
        with mps_ext.stream(consumer):
            lib.copy(result, data)
        time.sleep(0.02)
        assert not consumer.query()  # waiting for the held producer
    consumer.synchronize()
    assert result.tolist() == [7.0] * 64


def test_without_a_wait_the_consumer_runs_before_the_producer(lib):
    # What the waits above prevent: the same work without one reads the data unwritten.
    producer, consumer = mps_ext.Stream("cpu"), mps_ext.Stream("cpu")
    data, result = torch.zeros(64), torch.full((64,), -1.0)
    with hold(producer):
        with mps_ext.stream(producer):
            lib.fill(data, 7.0)
        with mps_ext.stream(consumer):
            lib.copy(result, data)
        consumer.synchronize()
        assert result.tolist() == [0.0] * 64 and not producer.query()
    producer.synchronize()


def test_default_stream_waits_on_the_host():
    s, held, releasing = mps_ext.Stream("cpu"), threading.Event(), threading.Event()

    def holder():
        with hold(s):
            held.set()
            time.sleep(0.05)
            releasing.set()

    t = threading.Thread(target=holder)
    t.start()
    held.wait()
    e = s.record_event()
    # The simulator's default stream is the calling thread: waiting there blocks until reached.
    mps_ext.default_stream("cpu").wait_event(e)
    assert releasing.is_set() and e.query()
    t.join()


def test_synchronize_waits_for_every_stream():
    # mps_ext.synchronize(device): the default stream and every stream handed out, each held by a thread here
    # until a moment after the call starts waiting.
    streams, held, released = [mps_ext.Stream("cpu") for _ in range(3)], threading.Barrier(4), threading.Event()

    def holder(s):
        with hold(s):
            held.wait()
            time.sleep(0.05)
            released.set()

    threads = [threading.Thread(target=holder, args=(s,)) for s in streams]
    for t in threads:
        t.start()
    held.wait()
    assert not any(s.query() for s in streams)
    mps_ext.synchronize("cpu")
    assert released.is_set() and all(s.query() for s in streams)
    for t in threads:
        t.join()


def test_query_transitions(lib):
    s = mps_ext.Stream("cpu")
    assert s.query()
    e = mps_ext.Event()
    with hold(s):
        assert not s.query()
        e.record(s)
        assert not e.query()
    e.synchronize()
    s.synchronize()
    assert s.query() and e.query()
    e.record(s)  # re-recording an event replaces the record
    e.synchronize()
    assert e.query()


# Timing


def test_elapsed_time_grows_with_the_work(lib):
    s = mps_ext.Stream("cpu")
    out = torch.zeros(1 << 16)

    def time_fills(n: int) -> float:
        start, end = mps_ext.Event(enable_timing=True), mps_ext.Event(enable_timing=True)
        start.record(s)
        with mps_ext.stream(s):
            for _ in range(n):
                lib.fill(out, 1.0)
        end.record(s)
        return start.elapsed_time(end)

    short, long = time_fills(1), time_fills(32)
    assert 0 < short < long


def test_elapsed_time_counts_time_the_stream_was_held():
    s = mps_ext.Stream("cpu")
    start, end = mps_ext.Event(enable_timing=True), mps_ext.Event(enable_timing=True)
    start.record(s)
    start.synchronize()
    with hold(s):
        end.record(s)
        time.sleep(0.05)
    assert start.elapsed_time(end) >= 50.0 * 0.9


def test_elapsed_time_errors():
    s = mps_ext.Stream("cpu")
    untimed, timed, unrecorded = mps_ext.Event(), mps_ext.Event(enable_timing=True), mps_ext.Event(True)
    untimed.record(s)
    timed.record(s)
    with pytest.raises(RuntimeError, match="enable_timing=True"):
        untimed.elapsed_time(timed)
    with pytest.raises(RuntimeError, match="enable_timing=True"):
        timed.elapsed_time(untimed)
    with pytest.raises(RuntimeError, match="must be recorded"):
        timed.elapsed_time(unrecorded)
    with pytest.raises(TypeError):
        timed.elapsed_time(s)


# The current stream


def test_stream_contexts_nest_and_restore():
    a, b = mps_ext.Stream("cpu"), mps_ext.Stream("cpu")
    default = mps_ext.default_stream("cpu")
    assert a != b and mps_ext.current_stream("cpu") == default
    with mps_ext.stream(a):
        assert mps_ext.current_stream("cpu") == a
        with mps_ext.stream(b):
            assert mps_ext.current_stream("cpu") == b
            with mps_ext.stream(None):
                assert mps_ext.current_stream("cpu") == b
        assert mps_ext.current_stream("cpu") == a
        with pytest.raises(KeyError), mps_ext.stream(b):
            raise KeyError
        assert mps_ext.current_stream("cpu") == a
    assert mps_ext.current_stream("cpu") == default
    mps_ext.set_stream(a)
    try:
        assert mps_ext.current_stream("cpu") == a
    finally:
        mps_ext.set_stream(default)
    assert mps_ext.current_stream("cpu") == default


def test_the_current_stream_is_per_thread(lib):
    s = mps_ext.Stream("cpu")
    seen, out = {}, torch.zeros(8)
    inside, done = threading.Event(), threading.Event()

    def other_thread():
        seen["before"] = mps_ext.current_stream("cpu")
        inside.wait()
        seen["while main is in a block"] = mps_ext.current_stream("cpu")
        lib.fill(out, 5.0)  # on this thread's default stream: at once
        seen["out"] = out.tolist()
        with mps_ext.stream(s):
            seen["own block"] = mps_ext.current_stream("cpu")
        done.set()

    t = threading.Thread(target=other_thread)
    t.start()
    with mps_ext.stream(s):
        inside.set()
        done.wait()
        assert mps_ext.current_stream("cpu") == s  # the other thread's block did not change ours
    t.join()
    default = mps_ext.default_stream("cpu")
    assert seen["before"] == default and seen["while main is in a block"] == default
    assert seen["out"] == [5.0] * 8 and seen["own block"] == s


def test_torch_streams_are_accepted():
    torch_default = torch.Stream(device="cpu")
    assert torch_default.stream_id == 0
    with mps_ext.stream(torch_default):
        assert mps_ext.current_stream("cpu") == mps_ext.default_stream("cpu")


def _unrecorded_torch_event():
    # torch.mps.Event() needs a Metal device; one with id 0 is never released by its __del__.
    event = torch.mps.Event.__new__(torch.mps.Event)
    event._Event__eventId = 0
    return event


def test_torch_mps_event_misuse():
    with pytest.raises(RuntimeError, match="belongs to mps, the stream is on cpu"):
        mps_ext.Stream("cpu").wait_event(_unrecorded_torch_event())
    with pytest.raises(NotImplementedError, match="default mps stream only"):
        mps_ext.Stream("cpu").record_event(_unrecorded_torch_event())
    with pytest.raises(NotImplementedError, match="record an mps_ext.Event instead"):
        mps_ext.Stream._of(torch.device("mps"), 3).record_event(_unrecorded_torch_event())


def test_a_stream_waits_for_a_torch_mps_event(device):
    if device != "mps":
        pytest.skip("torch.mps.Event needs mps")
    x = torch.randn(512, 4096, device="mps")
    y = torch.exp(x) * 2  # a torch op on the default stream
    event = torch.mps.Event()
    mps_ext.default_stream("mps").record_event(event)
    s = mps_ext.Stream("mps")
    s.wait_event(event)
    with mps_ext.stream(s):
        z = mps_ext.softmax(y, -1)
    s.synchronize()
    assert event.query()
    assert_close(z.cpu(), torch.softmax(torch.exp(x.cpu()) * 2, -1))


# Lifetimes


def test_launch_keeps_its_tensors_alive():
    # Large enough for the allocator to return the memory to the system when freed,
    # so a kernel reading it after the free would fault.
    x = torch.randn(256, 1024)
    want = torch.softmax(x, -1)
    s = mps_ext.Stream("cpu")
    with mps_ext.sim.checked(), hold(s):
        with mps_ext.stream(s):
            y = mps_ext.softmax(x, -1)
        del x
    s.synchronize()
    assert_close(y, want, scale=reduction_scale(torch.float32, 1024, signed_terms=False))


def numpy_backed(n: int):
    """A tensor whose memory belongs to a numpy array, and an event set when that memory is freed."""
    array = np.ones(n, dtype=np.float32)
    freed = threading.Event()
    weakref.finalize(array, freed.set)
    return torch.from_numpy(array), freed


def test_record_stream_keeps_memory_until_the_stream_ran_its_work():
    s = mps_ext.Stream("cpu")
    t, freed = numpy_backed(1024)
    del t
    assert freed.is_set()  # without record_stream, memory goes at once

    t, freed = numpy_backed(1024)
    with hold(s):
        mps_ext.record_stream(t, s)
        del t
        time.sleep(0.02)
        assert not freed.is_set()
    s.synchronize()
    assert freed.is_set()


# Errors


def test_async_kernel_errors_are_raised_by_synchronize(lib):
    s, out = mps_ext.Stream("cpu"), torch.zeros(8)
    with mps_ext.sim.checked(), mps_ext.stream(s):
        lib.write_past_the_end(out)  # enqueued: no error yet
    with pytest.raises(mps_ext.sim.SimulatorError, match="out of bounds|out-of-bounds"):
        s.synchronize()
    s.synchronize()  # reported once


def test_misuse_errors():
    cpu_stream = mps_ext.Stream("cpu")
    # A handle to the mps default stream: the device checks come before any Metal call.
    mps_stream = mps_ext.Stream._of(torch.device("mps"), 0)
    with pytest.raises(ValueError, match="'mps' and 'cpu'"):
        mps_ext.Stream("cuda")
    with pytest.raises(ValueError, match="one cpu device"):
        mps_ext.Stream("cpu:1")
    if not mps_ext._C._has_metal():
        with pytest.raises(RuntimeError, match="no Metal backend"):
            mps_ext.Stream("mps")
    with pytest.raises(TypeError, match="mps_ext.Stream"):
        with mps_ext.stream(3):
            pass
    with pytest.raises(TypeError, match="mps_ext.Event"):
        cpu_stream.wait_event(cpu_stream)
    with pytest.raises(RuntimeError, match="cannot wait for a stream on mps"):
        cpu_stream.wait_stream(mps_stream)
    e = mps_ext.Event()
    e.record(cpu_stream)
    with pytest.raises(RuntimeError, match="belongs to cpu"):
        e.record(mps_stream)
    with pytest.raises(RuntimeError, match="belongs to cpu"):
        mps_stream.wait_event(e)
    with pytest.raises(RuntimeError, match="the tensor is on meta"):
        mps_ext.record_stream(torch.empty(2, device="meta"), cpu_stream)
    with pytest.raises(TypeError, match="expects a tensor"):
        mps_ext.record_stream([1.0], cpu_stream)
    with pytest.raises(ValueError, match="cannot be held"):
        with hold(mps_ext.default_stream("cpu")):
            pass


@contextlib.contextmanager
def held_for_a_moment(s):
    """Another thread holds stream s for 50 ms from the start of the block: what the block enqueues has not
    run when the call that enqueued it returns, and a host read that does not wait for it reads too early."""
    held = threading.Event()

    def holder():
        with hold(s):
            held.set()
            time.sleep(0.05)

    t = threading.Thread(target=holder)
    t.start()
    held.wait()
    try:
        yield
    finally:
        t.join()


def test_torch_ops_inside_an_op_see_its_kernels():
    # softmax over a dimension with few columns runs on a copy with the dim moved last, then
    # copies the result back with a torch op, which must wait for the (here: held) stream.
    x = torch.randn(300, 4)
    s = mps_ext.Stream("cpu")
    with held_for_a_moment(s), mps_ext.trace() as tr, mps_ext.stream(s):
        y = mps_ext.softmax(x, 0)
    assert tr.names == ["softmax_block_float_float"]
    assert_close(y, torch.softmax(x, 0), scale=reduction_scale(torch.float32, 300, signed_terms=False))


def test_divergence_warnings_of_async_kernels_come_from_synchronize(kernels):
    bugs = kernels("planted_bugs")
    x, y = torch.arange(64, dtype=torch.float32), torch.empty(64)
    s = mps_ext.Stream("cpu")
    with mps_ext.stream(s):
        bugs.divergent_simd_sum(x, y, group_size=64)  # enqueued: no warning yet
    with pytest.warns(mps_ext.sim.DivergenceWarning, match="planted_bugs.metal"):
        s.synchronize()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_streams_work_in_a_forked_child(lib):
    s = mps_ext.Stream("cpu")
    with mps_ext.stream(s):
        pid = os.fork()
        if pid == 0:  # the child: the parent's stream threads are gone
            code = 1
            try:
                out = torch.zeros(4)
                child_stream = mps_ext.Stream("cpu")
                with mps_ext.stream(child_stream):
                    lib.fill(out, 1.0)
                child_stream.synchronize()
                code = 0 if out.tolist() == [1.0] * 4 and mps_ext.current_stream("cpu").stream_id == 0 else 2
            finally:
                os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def linalg_steps(A, B):
    """Name: (call, torch's call for the reference), for linear algebra whose calls read info or pivots on
    the host (torch's composites too), for qr, whose R torch's triu takes from the factors, and for
    solve_triangular, which reads nothing. A is singular or not;
    the triangle and the factors solved with come from a well-conditioned matrix."""
    good = torch.randn(A.shape, generator=torch.Generator().manual_seed(1)) + 8 * torch.eye(A.shape[-1])
    torch_steps = {
        "lu_factor_ex(check_errors)": lambda: torch.linalg.lu_factor_ex(A, check_errors=True),
        "lu_factor": lambda: torch.linalg.lu_factor(A),
        "lu_factor then lu_solve": lambda: torch.linalg.lu_solve(*torch.linalg.lu_factor(good), B),
        "solve": lambda: torch.linalg.solve(A, B),
        "solve, order 3": lambda: torch.linalg.solve(A[..., :3, :3], B[..., :3, :]),
        "solve, broadcast factors": lambda: torch.linalg.solve(A[:, None], B.expand(2, *B.shape).transpose(0, 1)),
        "solve_triangular": lambda: torch.linalg.solve_triangular(good.triu(), B, upper=True),
        "qr": lambda: torch.linalg.qr(A),
        "inv": lambda: torch.linalg.inv(A),
        "inv, order 3": lambda: torch.linalg.inv(A[..., :3, :3]),
    }
    steps = {f"torch {name}": (step, step) for name, step in torch_steps.items()}
    steps["mps_ext lu_factor_ex(check_errors)"] = (lambda: mps_ext.lu_factor_ex(A, check_errors=True),
                                                   torch_steps["lu_factor_ex(check_errors)"])
    steps["mps_ext lu_factor then lu_solve"] = (lambda: mps_ext.lu_solve(*mps_ext.lu_factor(good), B),
                                                torch_steps["lu_factor then lu_solve"])
    steps["mps_ext solve"] = (lambda: mps_ext.solve(A, B), torch_steps["solve"])
    steps["mps_ext inv"] = (lambda: mps_ext.inv(A), torch_steps["inv"])
    steps["mps_ext qr"] = (lambda: mps_ext.qr(A), torch_steps["qr"])
    return steps


def outcome(step):
    """What `step` returns, as a tuple, or the type of the RuntimeError it raises."""
    try:
        out = step()
    except RuntimeError as e:
        return type(e)
    return tuple(out) if isinstance(out, tuple) else (out,)


@pytest.mark.parametrize("singular", [False, True], ids=["invertible", "singular"])
def test_host_reads_of_linalg_results_wait_for_their_kernels(singular):
    """Each call on a stream held while it is enqueued, twice: reads of info and pivots on the host wait for
    the kernels that write them."""
    gen = torch.Generator().manual_seed(0)
    A = torch.randn(3, 8, 8, generator=gen) + 8 * torch.eye(8)
    if singular:
        A[1, :, 2] = 0  # an exactly zero pivot in U: info = 3
    B = torch.randn(3, 8, 2, generator=gen)
    s = mps_ext.Stream("cpu")
    for name, (step, reference) in linalg_steps(A, B).items():
        want = outcome(reference)
        for _ in range(2):
            with mps_ext.overrides.enabled("cpu"), mps_ext.trace() as tr, held_for_a_moment(s), mps_ext.stream(s):
                got = outcome(step)
            s.synchronize()
            assert any(k.startswith(("lu_", "trsm_", "qr_")) for k in tr.names), name
            if isinstance(want, type) or isinstance(got, type):
                assert got is want, f"{name}: {got} instead of {want}"
                continue
            for g, w in zip(got, want, strict=True):
                if g.is_floating_point():  # order 8, about 8I + noise: each entry sums up to 8 roundings
                    assert_close(g, w, scale=8)
                else:
                    assert torch.equal(g, w), name


def test_ctrl_c_interrupts_every_wait_for_a_long_kernel():
    """A kernel on a stream runs until a timeout; Ctrl-C stops each wait for it (the stream's, an event's,
    the default stream's), and the stream reports the timeout later."""
    code = textwrap.dedent(f"""
        import torch, mps_ext, mps_ext.sim
        from mps_ext.sim import SimulatorError
        lib = mps_ext.sim.compile_shader({LIMITS_SOURCE!r}, name="limits")
        s = mps_ext.Stream("cpu")
        with mps_ext.sim.checked(timeout=8), mps_ext.stream(s):
            lib.forever(torch.ones(4), {UNTIL_FOREVER}, arg_casts="int32", threads=4)
        done = s.record_event()
        waits = {{"stream": s.synchronize, "event": done.synchronize,
                  "default stream": lambda: done.wait(mps_ext.default_stream("cpu"))}}
        for name, wait in waits.items():
            print("waiting", flush=True)
            try:
                wait()
                print(name, "returned", flush=True)
            except KeyboardInterrupt:
                print(name, "interrupted", flush=True)
        try:
            s.synchronize()
        except SimulatorError as e:
            print("stream:", e, flush=True)
        x = torch.zeros(4)
        lib.fill(x, 2.0)
        print("after", x.tolist(), flush=True)
        """)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": root})
    lines = []
    try:
        for _ in range(3):
            lines.append(proc.stdout.readline().strip())
            assert lines[-1] == "waiting", lines + [proc.stderr.read() if proc.poll() is not None else ""]
            time.sleep(0.3)
            proc.send_signal(signal.SIGINT)
            lines.append(proc.stdout.readline().strip())
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert lines[1::2] == ["stream interrupted", "event interrupted", "default stream interrupted"], lines
    assert "timed out" in out and "after [2.0, 2.0, 2.0, 2.0]" in out, out + err
