"""Every kernel this build ships runs clean in the simulator's checked mode (guard pages, canaries, three
schedules compared: races, divergence, out-of-bounds access) and matches torch: the self-test's cases, each
under ``mps_ext.sim.checked()``. A new kernel that no case runs fails here."""

import mps_ext
from mps_ext import _C, _selftest


def test_every_builtin_kernel_runs_checked_and_matches_torch():
    ran: set[str] = set()
    failed = []
    with mps_ext.sim.checked():
        for case in _selftest.cases():
            good, err, names, backends = _selftest.verify(case, "cpu")
            assert names, f"{case.name}: no kernel ran"
            if not good or backends != {"simulator"}:
                failed.append(f"{case.name}: max |err| {err:.2e}, {backends}")
            ran.update(names)
    assert not failed, failed
    shipped = set(_C._sim_builtin_kernels())
    assert ran <= shipped, sorted(ran - shipped)
    assert shipped - ran == set(), f"kernels never run in checked mode: {sorted(shipped - ran)}"
