"""Streams, events and errors of csrc/metal as a Mac runs them: command
buffers complete on another thread, completion handlers run later, torch's
default stream runs torch's ops asynchronously (tools/metal_emu)."""

import gc
import time

import pytest
import torch

import mps_ext
from mps_ext.testing import assert_close


def rows(n=8, width=300, seed=0):
    return torch.randn(n, width, generator=torch.Generator().manual_seed(seed))


def assert_softmax(got, x):
    assert_close(got, torch.softmax(x, -1))


def test_a_kernel_on_a_stream_sees_torchs_work_before_it(emu):
    x = rows()
    gpu = x.to("mps")
    x.select(1, 0).fill_(30.0)
    s = mps_ext.Stream("mps")
    with mps_ext.trace() as t, mps_ext.stream(s):
        gpu.select(1, 0).fill_(30.0)  # torch's own work: on torch 2.13 on its default stream, else on s
        y = mps_ext.softmax(gpu, -1)
    s.synchronize()
    assert [k.backend for k in t.kernels] == ["metal"]
    assert_softmax(y, x)


def test_torch_sees_a_streams_kernel_before_it(emu):
    a = torch.tensor([[4.0, 3.0], [6.0, 3.0]])
    s = mps_ext.Stream("mps")
    with mps_ext.stream(s):
        # lu_factor checks the info its kernel wrote with torch's ops; torch made
        # info (zeros) on its default stream before.
        with pytest.raises(RuntimeError, match=r"U\[1,1\] is zero"):
            mps_ext.lu_factor(torch.zeros(2, 2).to("mps"))
        lu, pivots = mps_ext.lu_factor(a.to("mps"))
    s.synchronize()
    want_lu, want_pivots = torch.linalg.lu_factor(a)
    assert_close(lu, want_lu)
    assert torch.equal(pivots.cpu(), want_pivots)


def test_query_is_true_once_the_stream_has_run(emu):
    s = mps_ext.Stream("mps")
    assert s.query()  # idle
    with mps_ext.stream(s):
        mps_ext.softmax(rows().to("mps"), -1)
    s.synchronize()
    assert s.query()
    assert mps_ext.default_stream("mps").query()


@pytest.mark.parametrize("waiter", ["stream", "event", "default stream"])
def test_synchronize_raises_the_first_gpu_error(emu, waiter):
    s = mps_ext.default_stream("mps") if waiter == "default stream" else mps_ext.Stream("mps")
    x = rows().to("mps")
    emu.fail_next_kernel("emulated GPU fault")
    with mps_ext.stream(s):
        mps_ext.softmax(x, -1)
        event = s.record_event()
    with pytest.raises(RuntimeError, match="emulated GPU fault"):
        event.synchronize() if waiter == "event" else s.synchronize()
    # Reported once: the stream goes on.
    with mps_ext.stream(s):
        y = mps_ext.softmax(x, -1)
    s.synchronize()
    assert_softmax(y, x.cpu())


def test_mps_ext_synchronize_raises_a_default_stream_failure(emu):
    # Before 2.15 torch reads no command buffer's status: a failed kernel on the default stream is raised by
    # mps_ext.synchronize(), which waits for every stream (torch.mps.synchronize() only the default one there).
    x = rows().to("mps")
    s = mps_ext.Stream("mps")
    emu.fail_next_kernel("emulated GPU fault")
    mps_ext.softmax(x, -1)
    with mps_ext.stream(s):
        y = mps_ext.softmax(x, -1)
    with pytest.raises(RuntimeError, match="emulated GPU fault"):
        mps_ext.synchronize("mps")
    assert s.query()
    assert_softmax(y, x.cpu())
    mps_ext.synchronize("mps")  # raised once


def test_a_failed_buffer_still_gives_its_signals(emu):
    # A command buffer that fails skips its later commands, an event's signal too: the event is signalled from
    # the CPU then, so query() turns True and a stream that waits on it runs on; the failure is raised once.
    s, other = mps_ext.Stream("mps"), mps_ext.Stream("mps")
    x = rows().to("mps")
    emu.fail_next_kernel("emulated GPU fault")
    with mps_ext.stream(s):
        mps_ext.softmax(x, -1)
        event = s.record_event()
    other.wait_event(event)
    with mps_ext.stream(other):
        y = mps_ext.softmax(x, -1)
    deadline = time.monotonic() + 20
    while not event.query():
        assert time.monotonic() < deadline, "the failed buffer's event was never signalled"
        time.sleep(0.01)
    other.synchronize()
    assert_softmax(y, x.cpu())
    with pytest.raises(RuntimeError, match="emulated GPU fault"):
        s.synchronize()


def test_events_live_until_the_gpu_is_done_with_them(emu):
    s, other = mps_ext.Stream("mps"), mps_ext.Stream("mps")
    before = emu.released_object_uses()
    x = rows().to("mps")
    with mps_ext.stream(other):
        mps_ext.softmax(x, -1)
    s.wait_stream(other)  # the event it records is dropped at once
    gc.collect()
    s.query()  # and so is the probe
    with mps_ext.stream(s):
        y = mps_ext.softmax(x, -1)
    s.synchronize()
    other.synchronize()
    assert emu.released_object_uses() == before
    assert_softmax(y, x.cpu())


def test_a_wait_gates_work_after_a_commit(emu):
    s, slow = mps_ext.Stream("mps"), mps_ext.Stream("mps")
    x = rows(64, 4096) * 20  # long enough for the simulator to take a while; peaked rows
    with mps_ext.stream(slow):
        y = mps_ext.softmax(x.to("mps"), -1)
    ready = slow.record_event()
    s.wait_event(ready)
    s.record_event()  # commits the buffer that holds the wait: later work is in another
    with mps_ext.stream(s):
        z = mps_ext.softmax(y, -1)
    s.synchronize()
    assert_softmax(z, torch.softmax(x, -1))


def test_record_stream_on_an_idle_stream_lets_go(emu):
    from torch.multiprocessing.reductions import StorageWeakRef

    s, other = mps_ext.Stream("mps"), mps_ext.Stream("mps")
    x = rows().to("mps")
    held = StorageWeakRef(x.untyped_storage())
    mps_ext.record_stream(x, s)  # nothing else is ever enqueued on s, nor is it synchronized
    del x
    for _ in range(200):
        other.synchronize()  # frees what completed work let go of
        if held.expired():
            break
        time.sleep(0.01)
    assert held.expired()


@pytest.mark.parametrize("op", ["lu_factor_ex", "solve_ex", "inv_ex"])
def test_check_errors_on_a_stream_reads_what_the_kernel_wrote(emu, op):
    # check_errors=True reads the info the kernel writes with torch's ops, which on 2.13 run on the default
    # stream: the op makes them wait for the stream first, so a singular matrix on a stream still raises.
    s = mps_ext.Stream("mps")
    singular = torch.zeros(3, 3).to("mps")
    call = {"lu_factor_ex": lambda: mps_ext.lu_factor_ex(singular, check_errors=True),
            "solve_ex": lambda: mps_ext.solve_ex(singular, torch.ones(3, 1).to("mps"), check_errors=True),
            "inv_ex": lambda: mps_ext.inv_ex(singular, check_errors=True)}[op]
    with mps_ext.stream(s), mps_ext.trace() as t:
        with pytest.raises(RuntimeError, match="singular|zero"):
            call()
    assert t.kernels and all(k.backend == "metal" for k in t.kernels), t.names
    s.synchronize()
