"""Command line: ``python -m mps_ext info | selftest | demo | bench``."""

from __future__ import annotations

import argparse
import platform
import sys

import torch


def info() -> int:
    """Versions, backends, the Metal device (or why there is none) and the overrides."""
    from . import _C, __version__, overrides
    from ._load import BUILT_WITH
    from .sim import compiler
    from .testing import mps_usable

    usable, why = mps_usable()
    tc = compiler.toolchain()
    rows = [
        ("mps_ext", __version__),
        ("torch", f"{torch.__version__} (mps_ext built against {BUILT_WITH})"),
        ("python", platform.python_version()),
        ("platform", f"{platform.system()} {platform.release()} {platform.machine()}"),
        ("backends", "simulator" + (", metal" if _C._has_metal() else f" (metal: {_C._metal_unavailable()})")),
        ("mps device", "usable" if usable else f"not usable: {why}"),
        *((f"  {k}", v) for k, v in _C._metal_device_info()),
        ("overrides", ", ".join(f"{d}: {'on' if overrides.is_enabled(d) else 'off'}" for d in ("mps", "cpu"))),
        ("simulator", f"compiler {tc.cxx}, address spaces {'kept' if tc.address_spaces else 'erased: ' + tc.note}; "
                      f"cache {compiler.cache_dir()}"),
    ]
    for key, value in rows:
        print(f"{key:<12} {value}")
    return 0


def selftest() -> int:
    """The simulator's self-check, then every shipped kernel on every usable backend."""
    from . import _selftest
    from .sim import selfcheck

    print("simulator self-check (checked mode):")
    ok = selfcheck.run()
    print("\nkernels against torch on the CPU:")
    ok &= _selftest.run()
    print("\nall kernels match torch" if ok else "\nFAILED")
    return 0 if ok else 1


def main(argv=None) -> int:
    from . import bench, demo

    parser = argparse.ArgumentParser(prog="python -m mps_ext")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("info", help=info.__doc__)
    commands.add_parser("selftest", help=selftest.__doc__)
    demo.add_arguments(commands.add_parser("demo", help="decode a transformers model with and without mps_ext"))
    bench.add_arguments(commands.add_parser("bench", help="run the benchmarks; JSON, Markdown and a plot"))
    args = parser.parse_args(argv)
    if args.command == "demo":
        return demo.main(args)
    if args.command == "bench":
        return bench.main(args)
    return {"info": info, "selftest": selftest}[args.command]()


if __name__ == "__main__":
    sys.exit(main())
