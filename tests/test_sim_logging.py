"""MSL 3.2's shader logging (<metal_logging>: os_log, os_log_default) in the
simulator: what a kernel logs reaches stderr once per dispatch, formatted as
printf formats it, each message naming its level, its log, the kernel, the
thread and the .metal line. (Sources that target MSL 3.1 may not use it:
tests/test_msl_rules.py.)"""

import re

import pytest
import torch

import mps_ext
import mps_ext.sim
from mps_ext.sim import CompileError

SOURCE = r"""#include <metal_stdlib>
#include <metal_logging>
using namespace metal;
constant os_log logger("com.example.kernels", "scale");
kernel void scale(device const float* x [[buffer(0)]], device half* out [[buffer(1)]],
                  uint i [[thread_position_in_grid]]) {
  out[i] = half(x[i] * 2);
  if (x[i] < 0) logger.log_error("negative x[%u] = %.3f, out %g", i, x[i], out[i]);
  if (i == 0) os_log_default.log("%d threads, %s: %5d|%-4x|%08X|%c|%%", int(4), "done", -7, 255u, 48879u, 'A');
  if (i == 1) metal::os_log_default.log_info("%*d|%.*f|%lu|%ld", 6, int(i), 2, 1.25f, ulong(1) << 40, long(-3));
  if (i == 2) logger.log_debug("no " "arguments");
  if (i == 3) logger.log_fault("%d of %d", int(i));
}
"""
X = torch.tensor([1.5, -2.25, 0.5, -0.125])
LOGGER = "[com.example.kernels:scale]"
# (level, log, message as printf writes it (Python's % formats as C's printf and ignores length modifiers),
# thread, .metal line); a conversion without an argument stays as written.
EXPECTED = [
    ("default", "", "%d threads, %s: %5d|%-4x|%08X|%c|%%" % (4, "done", -7, 255, 48879, "A"), 0, 9),
    ("error", LOGGER, "negative x[%u] = %.3f, out %g" % (1, -2.25, -4.5), 1, 8),
    ("info", "", "%*d|%.*f|%lu|%ld" % (6, 1, 2, 1.25, 1 << 40, -3), 1, 10),
    ("debug", LOGGER, "no arguments", 2, 11),
    ("error", LOGGER, "negative x[%u] = %.3f, out %g" % (3, -0.125, -0.25), 3, 8),
    ("fault", LOGGER, "3 of %d", 3, 12),
]


@pytest.fixture(scope="module")
def lib():
    return mps_ext.sim.compile_shader(SOURCE, name="logging", msl_version="3.2")


def logged(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("os_log")]


def expected_lines() -> list[str]:
    source = mps_ext.sim.compiler.cache_dir() / f"logging-{mps_ext.sim.compiler.source_digest(SOURCE)}.metal"
    return [f"os_log {level}{' ' + log if log else ''}: {message} — kernel 'scale', thread ({thread}, 0, 0) "
            f"(threadgroup (0, 0, 0), thread ({thread}, 0, 0)) at {source}:{line}"
            for level, log, message, thread, line in EXPECTED]


def run(lib) -> torch.Tensor:
    out = torch.full((4,), float("nan"), dtype=torch.half)
    with mps_ext.trace() as t:
        lib.scale(X, out, threads=4, group_size=4)
    assert t.names == ["scale"]
    return out


def test_messages_reach_stderr_formatted_as_printf(lib, capfd):
    out = run(lib)
    torch.testing.assert_close(out, (X * 2).half(), rtol=0, atol=0)
    assert sorted(logged(capfd.readouterr().err)) == sorted(expected_lines())


def test_checked_mode_logs_each_message_once(lib, capfd):
    # Checked mode runs the dispatch under three schedules; the messages are those of one run.
    with mps_ext.sim.checked():
        run(lib)
    assert sorted(logged(capfd.readouterr().err)) == sorted(expected_lines())


def test_messages_beyond_the_buffer_are_counted(shader, capfd):
    lib = shader('#include <metal_logging>\nusing namespace metal;\nkernel void every(device int* out [[buffer(0)]], '
                 'uint i [[thread_position_in_grid]]) {\n  out[i] = i;\n  os_log_default.log("thread %u", i);\n}\n',
                 name="logging_every", msl_version="3.2")
    n = 4096 + 10
    lib.every(torch.zeros(n, dtype=torch.int32), threads=n)
    lines = logged(capfd.readouterr().err)
    assert len(lines) == 4096 + 1
    assert len({re.match(r"os_log default: (thread \d+) — ", line).group(1) for line in lines[:-1]}) == 4096
    assert lines[-1] == "os_log: 10 more messages of kernel 'every' dropped (4096 are kept per dispatch)"


def test_vector_arguments_are_compile_errors(shader):
    with pytest.raises(CompileError, match="os_log formats scalars"):
        shader('#include <metal_logging>\nusing namespace metal;\nkernel void vec(device float2* v [[buffer(0)]]) {\n'
               '  os_log_default.log("%f", v[0]);\n}\n', name="logging_vector", msl_version="3.2")


def test_a_failed_dispatch_writes_what_it_logged(shader, capfd):
    lib = shader('#include <metal_logging>\nusing namespace metal;\nkernel void fails(device int* out [[buffer(0)]], '
                 'uint i [[thread_position_in_grid]]) {\n  os_log_default.log_error("out[%u] = %d", i, out[i]);\n'
                 '  assert(out[i] >= 0);\n}\n', name="logging_fails", msl_version="3.2")
    with pytest.raises(mps_ext.sim.SimulatorError, match=r"assertion failed: out \[ i \] >= 0"):
        lib.fails(torch.tensor([-5], dtype=torch.int32), threads=1)
    assert [line.split(" — ")[0] for line in logged(capfd.readouterr().err)] == ["os_log error: out[0] = -5"]
