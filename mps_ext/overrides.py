"""Overrides of torch ops with mps_ext's kernels.

On import, mps_ext enables them for the ``mps`` device when MPS is available
(set ``MPS_EXT_DISABLE=1`` to opt out). They can be enabled for ``cpu`` too,
where the kernels run in the simulator: that is how the override routing and
fallbacks are tested without a Mac. Every case the kernels do not cover goes
to torch's own kernel, and ``stats()`` counts both.

Overridden: ``aten::_softmax``, ``aten::_log_softmax`` (``torch.softmax``,
``F.softmax``, ``torch.log_softmax``, ``F.log_softmax``...); ``aten::linear``
(``F.linear``, ``nn.Linear``), ``aten::mm`` / ``aten::addmm`` with a row- or
column-major right operand (``x @ W.T``, ``x @ W`` as transformers' ``Conv1D`` calls it),
for 1 to 8 rows, and ``aten::mv`` / ``aten::addmv`` (``W @ v``, ``torch.mv``,
``torch.addmv``);
``aten::linalg_lu_factor_ex``, ``aten::linalg_lu_solve``, ``aten::_linalg_solve_ex``,
``aten::linalg_solve_triangular`` (``torch.linalg.lu_factor``, ``lu_solve``, ``solve``,
``solve_triangular``...).

Graphs that torch.compile's inductor compiles keep the overridden ops for these kernels while the
overrides are on for their device (``mps_ext/_compile.py``); enabling or disabling them makes compiled
functions compile again.
"""

from __future__ import annotations

import contextlib
import os
import threading

import torch

from . import _C, _compile

__all__ = ["disable", "enable", "enabled", "is_enabled", "reset_stats", "stats"]


def enable(device: str = "mps") -> None:
    """Route the overridden torch ops on ``device`` ("mps" or "cpu") to mps_ext's kernels."""
    _C._overrides_enable(device)
    _compile.state_changed()


def disable(device: str = "mps") -> None:
    """Restore torch's own kernels on ``device``."""
    _C._overrides_disable(device)
    _compile.state_changed()


def is_enabled(device: str = "mps") -> bool:
    """Whether the overrides are active on ``device``."""
    return _C._overrides_is_enabled(device)


# Open `enabled()` blocks per device, and whether the overrides were on before the first one.
_blocks_lock = threading.Lock()
_blocks: dict[str, list] = {}


@contextlib.contextmanager
def enabled(device: str = "mps"):
    """Enable the overrides on ``device`` inside a ``with`` block, then restore the previous state.

    Blocks may be open on several threads at once (the overrides are process-wide): they stay on until
    the last open block exits.
    """
    with _blocks_lock:
        was = is_enabled(device)
        entry = _blocks.setdefault(torch.device(device).type, [0, False])
        if entry[0] == 0:
            entry[1] = was
        enable(device)
        entry[0] += 1
    try:
        yield
    finally:
        with _blocks_lock:
            entry[0] -= 1
            if entry[0] == 0 and not entry[1]:
                disable(device)


def stats() -> dict[str, dict]:
    """Per aten op: ``{"hits": n, "fallbacks": m, "reasons": {reason: count}}`` since import or ``reset_stats()``.

    One count per call: what torch's own kernel calls when an override leaves a call to it (a linear's
    mm) is not counted again. Calls that autograd's backward makes are counted under ``"<op> (backward)"``.
    """
    return _C._override_stats()


def reset_stats() -> None:
    """Zero the counters of ``stats()``."""
    _C._override_reset_stats()


def enable_on_import() -> bool:
    """What ``import mps_ext`` does: enable for ``mps`` when MPS is available
    and ``MPS_EXT_DISABLE=1`` is not set. Returns whether it enabled them."""
    if os.environ.get("MPS_EXT_DISABLE") == "1" or not torch.backends.mps.is_available():
        return False
    enable("mps")
    return True
