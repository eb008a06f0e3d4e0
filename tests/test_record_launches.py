"""mps_ext.sim.record_launches: the ops' own host plans recorded instead of run, and replayed in the simulator.

A recording is what tools/cuda_check replays on a CUDA GPU, so it must be exactly what the simulator runs:
the same kernels, grids and threadgroups, the same parameter bytes on the same tensors, planned with the
fill the recording is given.
"""

import struct
import threading

import pytest
import torch
import torch.nn.functional as F

import mps_ext
from mps_ext.sim import Binding
from mps_ext.testing import TOLERANCES, assert_close

BF16 = torch.bfloat16


def _randn(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _gemv():
    x = torch.empty(305, dtype=BF16)[1:].view(1, 304)  # 2 bytes into its storage: bound at an offset
    x.copy_(_randn(1, 304, dtype=BF16))
    w, b = _randn(1001, 304, dtype=BF16, seed=1), _randn(1001, dtype=BF16, seed=2)
    return lambda: mps_ext.linear(x, w, b), lambda: F.linear(x.float(), w.float(), b.float())


def _softmax():  # rows longer than a threadgroup's: partials, then finalize
    x = _randn(3, 5003, dtype=BF16) * 4
    return lambda: mps_ext.softmax(x, -1, dtype=torch.float32), lambda: torch.softmax(x.float(), -1)


def _grouped_mm_decode():
    a, b = _randn(9, 48, dtype=BF16), _randn(4, 24, 48, dtype=BF16, seed=1).transpose(1, 2)
    offs = torch.tensor([2, 2, 7, 9], dtype=torch.int32)
    return lambda: mps_ext.grouped_mm(a, b, offs), lambda: torch._grouped_mm(a.float(), b.float(), offs)


def _fp8_linear():
    x, w = _randn(2, 160, dtype=BF16), _randn(40, 160, seed=1).to(torch.float8_e4m3fn)
    scale = torch.rand(40, generator=torch.Generator().manual_seed(2)) + 0.5
    return lambda: mps_ext.fp8_linear(x, w, scale), lambda: F.linear(x.float(), w.float() * scale[:, None])


def _lu_factor():  # lu_factor_ex: lu_factor checks info on the host, which a recording cannot give it
    A = _randn(5, 7, 7) + 7 * torch.eye(7)
    return lambda: mps_ext.lu_factor_ex(A)[:2], lambda: torch.linalg.lu_factor(A)


OPS = {"gemv": _gemv, "softmax": _softmax, "grouped_mm decode": _grouped_mm_decode, "fp8_linear": _fp8_linear,
       "lu_factor": _lu_factor}


def _outputs(result) -> list[torch.Tensor]:
    return list(result) if isinstance(result, (tuple, list)) else [result]


def _poison(t: torch.Tensor):
    t.fill_(float("nan") if t.is_floating_point() else -7)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def _binds(launches, t: torch.Tensor) -> bool:
    return any(isinstance(a, Binding) and a.tensor.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()
               for launch in launches for a in launch.args)


@pytest.mark.parametrize("op", OPS)
def test_recording_is_what_the_simulator_runs(op):
    run, _ = OPS[op]()
    with mps_ext.trace() as ran:
        run()
    with mps_ext.sim.record_launches() as recording, mps_ext.trace() as during:
        outputs = _outputs(run())
    assert [(l.kernel, l.grid, l.threadgroup) for l in recording.launches] == \
        [(k.name, k.grid, k.threadgroup) for k in ran.kernels]
    assert {k.backend for k in during.kernels} == {"recording"}  # kept, not run
    assert all(_binds(recording.launches, out) for out in outputs)


@pytest.mark.parametrize("op", OPS)
def test_replay_in_the_simulator_reproduces_the_op_bit_for_bit(op):
    run, reference = OPS[op]()
    expected = _outputs(run())
    with mps_ext.sim.record_launches() as recording:
        outputs = _outputs(run())
    for out in outputs:
        _poison(out)  # what the replay does not write stays NaN
    with mps_ext.trace() as replayed:
        recording.replay()
    assert [k.name for k in replayed.kernels] == [l.kernel for l in recording.launches]
    assert {k.backend for k in replayed.kernels} == {"simulator"}
    for out, exp in zip(outputs, expected):
        assert torch.equal(_bits(out), _bits(exp))
    out, ref = outputs[0], _outputs(reference())[0]
    assert_close(out.float(), ref.float(), dtype=out.dtype if out.dtype in TOLERANCES else torch.float32, scale=4)


def test_launch_records_slots_offsets_and_parameter_bytes():
    run, _ = _gemv()
    with mps_ext.sim.record_launches() as recording:
        y = run()
    (launch,) = recording.launches
    w, x, b, out, params = launch.args  # metal/gemv.metal's buffers 0-4
    assert (x.offset, x.size) == (2, 608) and (w.offset, w.size) == (0, 1001 * 304 * 2)
    assert out.tensor.untyped_storage().data_ptr() == y.untyped_storage().data_ptr()
    w_stride, x_stride, y_stride, n, k, m, has_bias, w_vectorized, x_vectorized = struct.unpack("<3Q6I", params)
    assert (n, k, m, has_bias, w_vectorized, x_vectorized) == (1001, 304, 1, 1, 1, 0)  # GemvParams
    assert (w_stride, x_stride, y_stride) == (304, 304, 1001)
    assert launch.threadgroup_memory == 0  # the dense GEMV keeps its partial sums in registers


def test_softmax_records_its_threadgroup_memory():
    with mps_ext.sim.record_launches() as recording:
        mps_ext.softmax(torch.randn(2, 1000), -1)  # the block kernel reduces through threadgroup memory
    (launch,) = recording.launches
    assert launch.kernel == "softmax_block_float_float" and launch.threadgroup_memory > 0


def test_fill_policy_is_asked_per_kernel_and_sizes_the_plan():
    x, w = _randn(1, 3000, dtype=BF16), _randn(1001, 3000, dtype=BF16, seed=1)
    asked = {1 << 20: set(), 1: set()}

    def fill(simdgroups):
        return lambda kernel, threads: asked[simdgroups].add((kernel, threads)) or simdgroups

    with mps_ext.sim.record_launches(fill_simdgroups=fill(1 << 20)) as wide:
        mps_ext.linear(x, w)
    with mps_ext.sim.record_launches(fill_simdgroups=fill(1)) as narrow:
        mps_ext.linear(x, w)
    # A GPU that 1001 rows cannot fill splits K (3 slices of 6 steps); one they fill runs a row per SIMD group.
    assert [(l.kernel, l.grid, l.threadgroup) for l in wide.launches] == \
        [("gemv_splitk_m1_r2_bfloat", (501, 1, 1), (96, 1, 1))]
    assert [(l.kernel, l.grid, l.threadgroup) for l in narrow.launches] == \
        [("gemv_dense_m1_r1_bfloat", (251, 1, 1), (128, 1, 1))]
    # Only about kernels that exist (the CUDA check answers from each kernel's occupancy).
    assert asked[1 << 20] == {("gemv_dense_m1_r1_bfloat", 128), ("gemv_splitk_m1_r2_bfloat", 128)}
    assert asked[1] == {("gemv_dense_m1_r1_bfloat", 128)}


@pytest.mark.parametrize("cores", [8, 80])
def test_fill_in_simdgroups_plans_as_the_simulators_cores(cores):
    a, b = _randn(8, 2048, dtype=BF16), _randn(16, 64, 2048, dtype=BF16, seed=1).transpose(1, 2)
    offs = torch.arange(1, 17, dtype=torch.int32).clamp(max=8)  # one token routed to 8 of 16 experts
    with mps_ext.sim.gpu_cores(cores), mps_ext.trace() as ran:
        mps_ext.grouped_mm(a, b, offs)
    with mps_ext.sim.record_launches(fill_simdgroups=cores * 32) as recording:
        mps_ext.grouped_mm(a, b, offs)
    assert [(l.kernel, l.grid, l.threadgroup) for l in recording.launches] == \
        [(k.name, k.grid, k.threadgroup) for k in ran.kernels]


def test_bad_fill_policies_raise_naming_the_argument():
    with pytest.raises(ValueError, match="fill_simdgroups must be positive"):
        with mps_ext.sim.record_launches(fill_simdgroups=0):
            pass
    with pytest.raises(TypeError, match="fill_simdgroups must be an int or a callable"):
        with mps_ext.sim.record_launches(fill_simdgroups=8.0):
            pass
    with pytest.raises(ValueError, match="fill_simdgroups must be positive, got -1 for kernel 'gemv_dense_m1_r1"):
        with mps_ext.sim.record_launches(fill_simdgroups=lambda kernel, threads: -1):
            mps_ext.linear(torch.randn(1, 64), torch.randn(32, 64))


def test_thread_limits_make_plans_fall_back_as_on_metal():
    # One row of x streams the FP8 weights past it with a SIMD group per 512 bytes of K (16 for K = 8192, 512
    # threads); where a kernel takes fewer (a translated kernel's launch bound on CUDA, a Metal pipeline's
    # maxTotalThreadsPerThreadgroup) the plan takes the kernel of one SIMD group per row, as on Metal. The
    # streamed MoE decode falls back to the decode kernel likewise.
    x, w = _randn(1, 8192, dtype=BF16), _randn(64, 8192, seed=1).to(torch.float8_e4m3fn)
    offs = torch.tensor([0, 1, 1, 2], dtype=torch.int32)
    experts = _randn(4, 24, 8192, seed=2).to(torch.float8_e4m3fn)
    asked = []

    def limit(most):
        return lambda kernel: asked.append(kernel) or most

    for most, kernels in ((512, ["fp8_linear_gemv_stream_bfloat", "fp8_grouped_mm_stream16_bfloat"]),
                          (256, ["fp8_linear_gemv_m1_bfloat", "fp8_grouped_mm_decode_m2_bfloat"])):
        with mps_ext.sim.record_launches(max_threads=limit(most)) as recording:
            mps_ext.fp8_linear(x, w, torch.tensor(0.5))
            mps_ext.fp8_grouped_mm(x.expand(2, -1), experts, torch.ones(4), offs)
        assert [l.kernel for l in recording.launches] == kernels
        assert all(l.threadgroup[0] <= most for l in recording.launches), recording.launches
    assert {"fp8_linear_gemv_stream_bfloat", "fp8_grouped_mm_stream16_bfloat"} <= set(asked)


def test_bad_thread_limits_raise_naming_the_argument():
    with pytest.raises(ValueError, match="max_threads must be positive"):
        with mps_ext.sim.record_launches(max_threads=0):
            pass
    with pytest.raises(TypeError, match="max_threads must be an int or a callable"):
        with mps_ext.sim.record_launches(max_threads="512"):
            pass
    # A kernel with nothing to fall back to raises, naming it and the limit.
    with pytest.raises(RuntimeError, match="fp8_linear_gemv_m1_bfloat' takes at most 16 threads per threadgroup here"):
        with mps_ext.sim.record_launches(max_threads=16):
            mps_ext.fp8_linear(_randn(1, 64, dtype=BF16), _randn(32, 64, seed=1).to(torch.float8_e4m3fn),
                               torch.tensor(0.5))


def test_recordings_do_not_nest():
    with mps_ext.sim.record_launches():
        with pytest.raises(RuntimeError, match="already open"):
            with mps_ext.sim.record_launches():
                pass
    with mps_ext.sim.record_launches() as recording:  # the failed one closed nothing
        mps_ext.softmax(torch.randn(2, 8), -1)
    assert len(recording.launches) == 1


def test_a_recording_keeps_only_its_own_threads_launches():
    # Another thread's ops run while this thread records: their results are written, and none of their
    # launches joins this recording; that thread may record on its own meanwhile.
    x = torch.randn(3, 40)
    started, recorded = threading.Event(), threading.Event()
    seen = {}

    def other():
        started.wait()
        seen["softmax"] = mps_ext.softmax(x, -1)
        with mps_ext.sim.record_launches() as own:
            mps_ext.log_softmax(x, -1)
        seen["own"] = [l.kernel for l in own.launches]
        recorded.set()

    thread = threading.Thread(target=other)
    thread.start()
    with mps_ext.sim.record_launches() as recording:
        started.set()
        assert recorded.wait(60)
        mps_ext.linear(_randn(1, 64), _randn(8, 64, seed=1))
    thread.join()
    torch.testing.assert_close(seen["softmax"], torch.softmax(x, -1))
    assert seen["own"] == ["log_softmax_simd_float_float"]
    assert [l.kernel for l in recording.launches] == ["gemv_dense_m1_r2_float"]


def test_a_launch_after_a_host_read_of_recorded_results_raises():
    A = torch.randn(2, 5, 4)
    with mps_ext.sim.record_launches() as recording:
        Q, R = mps_ext.qr(A)  # R is the triangle of the recorded factors, made on the host: left unwritten
        with pytest.raises(RuntimeError, match=r"a launch \('softmax_simd_float_float'\) after a host read .*"
                                               r"'qr_householder_simd_float' was recorded"):
            mps_ext.softmax(torch.randn(2, 8), -1)
    assert [l.kernel for l in recording.launches] == ["qr_geqrf_simd_float", "qr_householder_simd_float"]
    recording.replay()  # the kernels' own outputs fill in: Q, and the factors whose triangle is R
    torch.testing.assert_close(Q, torch.linalg.qr(A)[0], atol=1e-5, rtol=1e-5)
    factors = recording.launches[0].args[1].tensor
    torch.testing.assert_close(factors.mT[:, :4].triu(), torch.linalg.qr(A)[1], atol=1e-5, rtol=1e-5)


def test_replay_of_an_open_recording_raises():
    with mps_ext.sim.record_launches() as recording:
        with pytest.raises(RuntimeError, match="still open"):
            recording.replay()
