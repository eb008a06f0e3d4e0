"""What the emulated Metal (tools/metal_emu) cannot settle, checked on a Mac's
GPU: skipped wherever MPS does not really run."""

import pytest
import torch

import mps_ext
from mps_ext.testing import assert_close, assert_fp8_linear_decodes_every_e4m3_code, mps_usable

usable, why = mps_usable()
pytestmark = pytest.mark.skipif(not usable, reason=why)


def test_every_e4m3_code_through_the_fp8_gemv():
    # Subnormal codes included: the GEMV decodes them through half subnormals, which a GPU that flushes half
    # denormals would lose (tests/metal_emu/test_half_subnormals.py).
    assert_fp8_linear_decodes_every_e4m3_code("mps")


def test_a_wait_holds_work_committed_after_it():
    # The GPU's answer to what the emulation assumes pessimistically: work in a
    # command buffer committed after the one holding a wait runs after it too.
    s, slow = mps_ext.Stream("mps"), mps_ext.Stream("mps")
    x = torch.randn(64, 1 << 16) * 20
    with mps_ext.stream(slow):
        y = mps_ext.softmax(x.to("mps"), -1)
    s.wait_event(slow.record_event())
    s.record_event()  # commits the buffer that holds the wait
    with mps_ext.stream(s):
        z = mps_ext.softmax(y, -1)
    s.synchronize()
    assert_close(z, torch.softmax(torch.softmax(x, -1), -1))


def test_lu_factor_of_complex64_within_the_threadgroup_memory_of_its_pipeline():
    # lu_factor_simd for complex64 declares 32 KiB of threadgroup memory: it runs
    # where its pipeline fits the device, and falls back to torch where not.
    a = torch.randn(40, 40, dtype=torch.complex64)
    with mps_ext.trace() as t:
        lu, pivots, info = mps_ext.lu_factor_ex(a.to("mps"))
    want_lu, want_pivots, _ = torch.linalg.lu_factor_ex(a)
    assert_close(lu, want_lu, scale=40)
    assert torch.equal(pivots.cpu(), want_pivots) and int(info.cpu()) == 0
    names = [k.name for k in t.kernels]
    assert not names or names == ["lu_factor_simd_float2"], names


def test_ten_thousand_pads_of_varying_shape_keep_driver_memory_flat():
    # MPSGraph's padTensor keeps driver memory per call and shape (Wan2.2's tiled VAE decode: 270 GiB over
    # 8,764 pads); the kernels keep none. Shapes vary as a tiled decode's do: tiles, frames, channel counts.
    import torch.nn.functional as F

    def pads(count, seed):
        g = torch.Generator().manual_seed(seed)
        for _ in range(count):
            c, t, h, w = (int(v) for v in torch.randint(4, 48, (4,), generator=g))
            x = torch.randn(1, c, t, h, w, device="mps", dtype=torch.bfloat16)
            F.pad(x, (1, 1, 1, 1, 2, 0))

    pads(200, 0)  # the allocator's pools and the pipelines, once
    torch.mps.synchronize()
    torch.mps.empty_cache()
    before = torch.mps.driver_allocated_memory()
    with mps_ext.trace() as t:
        pads(10_000, 1)
    torch.mps.synchronize()
    torch.mps.empty_cache()
    assert set(t.names) == {"pad_constant_ushort"}
    grown = torch.mps.driver_allocated_memory() - before
    assert grown < 64 << 20, f"driver memory grew by {grown >> 20} MiB over 10,000 pads"


@pytest.mark.skipif(torch.__version__ < "2.14", reason="torch's ops follow the stream from 2.14 on")
def test_a_recorded_tensor_outlives_a_long_kernel_on_its_stream():
    # The README's prefetch pattern under a long kernel: a tensor used by torch's own op on another stream,
    # recorded there and let go at once. Its memory must not go to the next allocation of its size before the
    # op has run (torch 2.15's own recordStream records nothing for private-storage buffers).
    s = mps_ext.Stream("mps")
    x = torch.randn(256, 1 << 16)
    gpu = x.to("mps")
    torch.mps.synchronize()
    with mps_ext.stream(s):
        y = mps_ext.softmax(mps_ext.softmax(mps_ext.softmax(torch.randn(256, 1 << 16, device="mps"), -1), -1), -1)
        doubled = gpu * 2  # torch's op, after the long kernels on s
    mps_ext.record_stream(gpu, s)
    del gpu
    clobber = torch.full((256, 1 << 16), float("nan"), device="mps")  # the freed size, at once
    s.synchronize()
    assert_close(doubled, x * 2)
    del y, clobber
