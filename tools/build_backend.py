"""setuptools' build backend, building against the torch of the environment
that pip installs into.

With build isolation (pip's default), pip builds in a fresh environment that
holds only the build requirements. A plain ``torch>=2.13,<2.16`` there would be
the newest torch of the index, whatever torch the target environment has, and
an extension built against one torch does not load with another (its C++ ABI
changes between releases). pip runs the backend with the target environment's
Python, so the requirement is narrowed to the torch version found there; where
none is found (another build frontend, a fresh environment) the range stays,
and ``import mps_ext`` says what to do if the torch installed later differs.
"""

import os
import subprocess
import sys

from setuptools.build_meta import *  # noqa: F403 (the other hooks, unchanged)

TORCH_RANGE = ">=2.13,<2.16"


def installed_torch() -> str | None:
    """The torch release (no local suffix such as +cpu) of the environment
    pip installs into, or None."""
    # pip's isolation lives in PYTHONPATH and PYTHONNOUSERSITE: without them the
    # same Python sees the target environment's packages.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONNOUSERSITE")}
    probe = "import importlib.metadata as m; print(m.version('torch'))"
    result = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
    return result.stdout.strip().split("+")[0] if result.returncode == 0 else None


def torch_requirement() -> str:
    """``torch==<the target environment's>`` where that is a supported torch, else the supported range."""
    version = installed_torch()
    supported = version and (2, 13) <= tuple(int(p) for p in version.split(".")[:2]) < (2, 16)
    return f"torch=={version}" if supported else f"torch{TORCH_RANGE}"


# Not setuptools' own hooks, which run setup.py, and setup.py imports torch: pyproject.toml's
# requires are all setuptools needs.
def get_requires_for_build_wheel(config_settings=None):
    """The torch to build against (beside pyproject.toml's requires)."""
    return [torch_requirement()]


def get_requires_for_build_editable(config_settings=None):
    """As for a wheel: an editable build compiles the extension too."""
    return [torch_requirement()]
