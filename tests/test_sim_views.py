"""Strided views in the simulator: a kernel gets a copy of the view's elements, not of its storage span, and
only the bytes it changed go back, so what other threads write meanwhile inside the span is kept; accesses
between the elements are out of bounds."""

import contextlib
import sys
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
// dst[r, c] = src[r, c] + 1 for the first `cols` columns of rows `stride` floats apart, after `spins`
// rounds of barriers (which keep the dispatch running long enough to write beside it).
kernel void slow_increment(device float* dst [[buffer(0)]], device const float* src [[buffer(1)]],
                           constant uint& cols [[buffer(2)]], constant uint& stride [[buffer(3)]],
                           constant uint& spins [[buffer(4)]], uint i [[thread_position_in_grid]]) {
  for (uint k = 0; k < spins; ++k) threadgroup_barrier(mem_flags::mem_none);
  const uint j = i / cols * stride + i % cols;
  dst[j] = src[j] + 1.0f;
}
kernel void fill_rows(device float* x [[buffer(0)]], constant uint& cols [[buffer(1)]],
                      constant uint& stride [[buffer(2)]], uint i [[thread_position_in_grid]]) {
  x[i / cols * stride + i % cols] = float(i);
}
kernel void write_at(device float* x [[buffer(0)]], constant uint& at [[buffer(1)]],
                     uint i [[thread_position_in_grid]]) {
  if (i == 0) x[at] = 1.0f;
}
kernel void read_at(device float* x [[buffer(0)]], constant uint& at [[buffer(1)]],
                    uint i [[thread_position_in_grid]]) {
  if (i == 0) x[0] = x[at];
}
// Every thread writes its index to the view's second row: the last writer depends on the schedule.
kernel void race_on_row(device float* x [[buffer(0)]], constant uint& stride [[buffer(1)]],
                        uint i [[thread_position_in_grid]]) {
  x[stride] = float(i);
}
"""

ROWS, COLS, WIDTH = 64, 128, 256  # views x[:, :COLS] of (ROWS + 1, WIDTH): 8,192 floats beside them in their span
SPINS = 2000  # about a second of barriers for ROWS * COLS threads


@pytest.fixture(scope="module")
def lib():
    return mps_ext.sim.compile_shader(SOURCE, name="views")


class Beside:
    """dst and src of (ROWS + 1, WIDTH); slow_increment runs on their views [:, :COLS], whose spans hold the
    8,192 floats [:ROWS, COLS:] beside them."""

    def __init__(self):
        self.dst = torch.zeros(ROWS + 1, WIDTH)
        self.src = torch.randn(ROWS + 1, WIDTH, generator=torch.Generator().manual_seed(0))
        self.before = self.src.clone()
        self.written = torch.arange(1, ROWS * (WIDTH - COLS) + 1, dtype=torch.float32).view(ROWS, WIDTH - COLS)

    def launch(self, lib):
        lib.slow_increment(self.dst[:, :COLS], self.src[:, :COLS], COLS, WIDTH, SPINS, arg_casts="int32",
                           threads=(ROWS + 1) * COLS, group_size=COLS)

    def write(self):
        """Row by row, as other code would: beside both views, and into src's elements, which the kernel
        only reads."""
        for row in range(ROWS):
            self.dst[row, COLS:] = self.written[row]
            self.src[row, COLS:] = -self.written[row]
            self.src[row, :COLS] = 100.0 + row

    def check(self):
        lost = int((self.dst[:ROWS, COLS:] != self.written).sum()) + int((self.src[:ROWS, COLS:] != -self.written).sum())
        assert lost == 0, f"{lost} of {2 * self.written.numel()} writes beside the views were undone"
        assert torch.equal(self.src[:ROWS, :COLS], torch.arange(100.0, 100.0 + ROWS).unsqueeze(1).expand(ROWS, COLS)), \
            "writes to elements the kernel only read were undone"
        assert torch.equal(self.dst[:, :COLS], self.before[:, :COLS] + 1)  # what src held at the launch, plus 1
        assert torch.equal(self.dst[ROWS, COLS:], torch.zeros(WIDTH - COLS))  # past the span


def test_writes_beside_a_view_on_a_stream_are_kept(lib):
    t = Beside()
    s, started = mps_ext.Stream("cpu"), mps_ext.Event()
    with mps_ext.stream(s):
        started.record()
        t.launch(lib)
    started.synchronize()
    time.sleep(0.05)  # the kernel has loaded its copies
    t.write()
    assert not s.query(), "the kernel finished before the writes: make it longer"
    s.synchronize()
    t.check()


def test_writes_beside_a_view_from_another_thread_are_kept(lib):
    """The default stream runs the kernel on the calling thread; a second thread writes meanwhile."""
    t = Beside()
    started, finished, during = threading.Event(), threading.Event(), []

    def writer():
        started.wait()
        time.sleep(0.05)
        t.write()
        during.append(not finished.is_set())

    thread = threading.Thread(target=writer)
    thread.start()
    started.set()
    t.launch(lib)
    finished.set()
    thread.join()
    assert during == [True], "the kernel finished before the writes: make it longer"
    t.check()


def test_a_small_view_of_a_large_tensor_costs_what_the_view_holds():
    """16 x 16 floats, rows 16 MiB apart in a 256 MiB tensor: the dispatch takes memory for the view, not
    for the 240 MiB its span covers (measured as the process's peak resident memory)."""
    code = f"""
import torch, mps_ext.sim
lib = mps_ext.sim.compile_shader({SOURCE!r}, name="views")

def memory(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field)) * 1024

big = torch.empty(8192, 8192)  # never touched by the host: no resident memory
view = big[::512, :16]
lib.fill_rows(torch.empty(16, 16), 16, 16, arg_casts="int32", threads=256)  # the worker pool and its stacks
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # restarts the peak
resident = memory("VmRSS:")
lib.fill_rows(view, 16, 512 * 8192, arg_casts="int32", threads=256)
assert torch.equal(view, torch.arange(256.0).view(16, 16))
print((memory("VmHWM:") - resident) >> 20)
"""
    if not sys.platform.startswith("linux"):
        pytest.skip("reads the peak resident memory from /proc")
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr
    grown_mib = int(proc.stdout.split()[-1])
    assert grown_mib < 16, f"the dispatch took {grown_mib} MiB for a 1 KiB view"


@pytest.mark.parametrize("kernel, at, match", [
    ("write_at", 2048, r"out-of-bounds write of buffer\(0\) at byte offset 8192 .*this page holds none of its elements"),
    ("read_at", 2048, r"out-of-bounds read of buffer\(0\) at byte offset 8192 .*this page holds none of its elements"),
    ("write_at", 7 * 4096 - 8, r"out-of-bounds write to buffer\(0\) at byte offset 114656 .*between its elements"),
])
def test_accesses_between_a_views_elements_are_out_of_bounds(lib, kernel, at, match):
    """x[:, :4] of rows 16 KiB apart: a page without elements (8 KiB into the first row) is a guard, the
    bytes beside the elements in the pages that hold some (32 bytes before the last row's, which end the
    buffer and so its last page) are canaries; the tensor is left as it was."""
    x = torch.zeros(8, 4096)
    with pytest.raises(SimulatorError, match=match):
        getattr(lib, kernel)(x[:, :4], at, arg_casts="int32", threads=32)
    assert torch.equal(x, torch.zeros(8, 4096))


@pytest.mark.parametrize("checked", [False, True], ids=["default", "checked"])
@pytest.mark.parametrize("cols, width, at", [(1, 2, 1), (3, 4, 3), (4, 19, 10), (2, 18, 35)],
                         ids=["every-other", "one-float-gap", "gap-under-64-bytes", "next-rows-gap"])
def test_writes_between_a_views_elements_never_reach_the_tensor(lib, checked, cols, width, at):
    """x[:, :cols] of rows `width` floats apart, gaps of 4 to 60 bytes: a write at float `at` of the
    buffer, between two elements, is out of bounds in every mode and the tensor is left as it was."""
    x = torch.zeros(6, width)
    mode = mps_ext.sim.checked() if checked else contextlib.nullcontext()
    with mode, pytest.raises(SimulatorError, match=r"out-of-bounds write to buffer\(0\) .*between its elements"):
        lib.write_at(x[:, :cols], at, arg_casts="int32", threads=32)
    assert torch.equal(x, torch.zeros(6, width))


def test_checked_mode_compares_a_views_elements(lib):
    x = torch.zeros(8, 1024)
    with mps_ext.sim.checked():
        lib.fill_rows(x[:, :4], 4, 1024, arg_casts="int32", threads=32, group_size=16)
    assert torch.equal(x[:, :4], torch.arange(32.0).view(8, 4)) and not x[:, 4:].any()
    # The race is on the view's second row: its offset in the buffer is named, not one among the elements.
    with mps_ext.sim.checked(), pytest.raises(SimulatorError, match=r"not deterministic.*first at byte 409[6-9]"):
        lib.race_on_row(x[:, :4], 1024, arg_casts="int32", threads=64, group_size=32)


def test_a_view_over_more_page_ranges_than_are_guarded(lib):
    """A column of 300 rows 16 KiB apart spans more page ranges than are protected one by one (256): the
    span is then mapped whole, and still only the elements are copied and written back."""
    x = torch.full((300, 4096), -1.0)
    lib.fill_rows(x[:, :1], 1, 4096, arg_casts="int32", threads=300)
    assert torch.equal(x[:, 0], torch.arange(300.0)) and torch.equal(x[:, 1:], torch.full((300, 4095), -1.0))
