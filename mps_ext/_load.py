"""Loading mps_ext._C, the compiled part, which works only with the torch it
was compiled against: torch's C++ ABI changes between releases."""

import importlib

import torch

from ._build import TORCH as BUILT_WITH


def _release(version: str) -> tuple[int, int]:
    return tuple(int(p) for p in version.split("+")[0].split(".")[:2])


def mismatch_message(built_with: str, installed: str) -> str:
    """What ``import mps_ext`` says when its compiled part and the installed torch differ."""
    return (f"mps_ext was built against torch {built_with}, but torch {installed} is installed: its compiled "
            f"part (mps_ext._C) loads only with the torch it was built against. Rebuild it against the installed "
            f"torch, from the mps_ext source: pip install --no-build-isolation . "
            f"(with build isolation pip may build against another torch)")


def load_extension():
    """mps_ext._C, or an ImportError that names both torch versions and the fix."""
    if _release(BUILT_WITH) != _release(torch.__version__):
        raise ImportError(mismatch_message(BUILT_WITH, torch.__version__))
    try:
        return importlib.import_module("mps_ext._C")
    except ImportError as e:  # an undefined torch symbol: a patch release that changed the ABI
        if "symbol" not in str(e):
            raise
        raise ImportError(f"{mismatch_message(BUILT_WITH, torch.__version__)}\n({e})") from None
