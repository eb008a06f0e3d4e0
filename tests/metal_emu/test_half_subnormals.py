"""The FP8 decode of csrc/metal's kernels on a GPU that flushes half
denormals: the emulated GPU with mps_ext.sim.flush_half_subnormals(). Apple's
GPUs keep them (tests/test_metal_hardware.py checks it on a Mac); here the
subnormal codes, and only they, are lost, which shows that fp8_linear decodes
them through half subnormals."""

import mps_ext.sim
from mps_ext.testing import assert_fp8_linear_decodes_every_e4m3_code


def test_every_e4m3_code_decodes_exactly_where_half_subnormals_are_kept(emu):
    assert_fp8_linear_decodes_every_e4m3_code("mps")


def test_a_gpu_that_flushes_half_subnormals_loses_only_the_subnormal_codes(emu):
    with mps_ext.sim.flush_half_subnormals():
        assert_fp8_linear_decodes_every_e4m3_code("mps", half_subnormals_flushed=True)
