"""Command line: ``python -m mps_ext info`` and ``python -m mps_ext selftest``."""

from __future__ import annotations

import argparse
import platform
import sys

import torch


def _mps_status() -> str:
    if not torch.backends.mps.is_built():
        return "unavailable: this torch build has no MPS support"
    if not torch.backends.mps.is_available():
        return "unavailable: no Metal device (needs Apple silicon and macOS 14+)"
    return "available"


def info() -> int:
    """Versions, backends and the state of the Metal device."""
    from . import __version__
    from .sim import compiler

    rows = [
        ("mps_ext", __version__),
        ("torch", torch.__version__),
        ("python", platform.python_version()),
        ("platform", f"{platform.system()} {platform.machine()}"),
        ("mps device", _mps_status()),
        ("simulator", f"built in; compiler {compiler._cxx()}; cache {compiler.cache_dir()}"),
    ]
    for key, value in rows:
        print(f"{key:<11} {value}")
    return 0


def selftest() -> int:
    """Run the simulator's self-check kernels and compare them with torch."""
    from .sim import selfcheck

    print("simulator (checked mode):")
    ok = selfcheck.run()
    print("all kernels match torch" if ok else "FAILED")
    return 0 if ok else 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mps_ext")
    parser.add_argument("command", choices=["info", "selftest"])
    args = parser.parse_args(argv)
    return {"info": info, "selftest": selftest}[args.command]()


if __name__ == "__main__":
    sys.exit(main())
