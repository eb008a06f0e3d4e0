"""The FP8 decode of csrc/metal's kernels on a GPU that flushes half
denormals: the emulated GPU with mps_ext.sim.flush_half_subnormals()."""

import mps_ext.sim
from mps_ext.testing import assert_fp8_linear_decodes_every_e4m3_code


def test_every_e4m3_code_decodes_exactly_with_half_subnormals_flushed(emu):
    with mps_ext.sim.flush_half_subnormals():
        assert_fp8_linear_decodes_every_e4m3_code("mps")
