"""The project's per-dtype tolerances (defined once, in mps_ext.testing)."""

from mps_ext.testing import (TOLERANCES, assert_close, assert_close_conditioned, assert_close_dot,
                             assert_close_normwise, assert_lu_backward_stable, assert_solve_backward_stable,
                             assert_qr, assert_solves, reduction_scale)

__all__ = ["TOLERANCES", "assert_close", "assert_close_conditioned", "assert_close_dot", "assert_close_normwise",
           "assert_lu_backward_stable", "assert_qr", "assert_solve_backward_stable", "assert_solves",
           "reduction_scale"]
