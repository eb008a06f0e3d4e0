"""``python -m mps_ext bench``: the benchmark scripts of ``benchmarks/`` in one run, written as one JSON file,
a Markdown table and (with matplotlib) a plot of the speedup per shape, with the chip, the peak bandwidth the
``% peak`` column uses, and the torch and macOS versions.

Without a usable Apple GPU it says so and runs only the simulator benchmark (how fast the simulator runs
test kernels), which works anywhere.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import math
import platform
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

# --ops name -> benchmarks/<script>.py
SCRIPTS = {"softmax": "bench_softmax", "linear": "bench_linear", "fp8": "bench_fp8",
           "grouped_mm": "bench_grouped_mm", "linalg": "bench_linalg", "pad": "bench_pad",
           "upsample": "bench_upsample", "dropout": "bench_dropout", "attention": "bench_attention",
           "decode": "bench_decode", "simulator": "bench_simulator"}
GPU_OPS = ["softmax", "linear", "fp8", "grouped_mm", "linalg", "pad", "upsample", "dropout", "attention", "decode"]


@dataclass
class Column:
    """A column of a result table: the row's key, its header, the format of its numbers (none: a text
    column) and its width in printed tables."""

    key: str
    header: str
    fmt: str = ""
    width: int = 10

    def text(self, row: dict) -> str:
        value = row.get(self.key)
        if value is None:
            return "—"
        return format(value, self.fmt) if self.fmt and isinstance(value, (int, float)) else str(value)


def geomean(values) -> float | None:
    """Geometric mean of the values that are not None (None if there are none)."""
    values = [v for v in values if v]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def print_table(rows, columns: list[Column], out=print) -> list[dict]:
    """Prints ``rows`` (an iterable, printed as they come) under the columns' headers, then the geometric-mean
    speedup where there is a speedup column; returns the rows."""
    def line(texts):  # numbers right-aligned, text left-aligned
        return "  ".join(f"{t:>{c.width}}" if c.fmt else f"{t:<{c.width}}" for c, t in zip(columns, texts)).rstrip()

    out(line(c.header for c in columns))
    done = []
    for row in rows:
        out(line(c.text(row) for c in columns))
        done.append(row)
    g = geomean(r.get("speedup") for r in done)
    if g and any(c.key == "speedup" for c in columns):
        out(f"geomean speedup {g:.2f}x over {sum(1 for r in done if r.get('speedup'))} cases")
    return done


def benchmarks_dir() -> Path:
    """The benchmark scripts: ``mps_ext/benchmarks`` of an installed package (setup.py copies them there),
    else the checkout's ``benchmarks/`` (an editable install)."""
    here = Path(__file__).resolve().parent
    return next(d for d in (here / "benchmarks", here.parent / "benchmarks") if (d / "_common.py").is_file())


def load(script: str):
    """Imports ``benchmarks/<script>.py`` (the scripts import ``_common`` from their own directory)."""
    d = str(benchmarks_dir())
    if d not in sys.path:
        sys.path.insert(0, d)
    return importlib.import_module(script)


def environment(chip: str | None, peak: float | None, usable: bool, why: str) -> dict:
    """What the numbers were measured on."""
    from . import __version__

    return {"chip": chip, "peak_gbps": peak,
            "peak_source": "Apple's specifications (PEAK_GBPS in benchmarks/_common.py)" if peak else None,
            "macos": platform.mac_ver()[0] or None, "torch": torch.__version__, "mps_ext": __version__,
            "python": platform.python_version(), "platform": platform.platform(),
            "mps": "usable" if usable else f"not usable: {why}",
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def run(ops: list[str], out_dir: Path, repeat: int | None = None, out=print) -> dict:
    """Runs the benchmarks of ``ops`` (the GPU ones only where an Apple GPU is usable, the simulator's
    anywhere), prints their tables, writes ``bench.json``, ``bench.md`` and ``bench.png`` into ``out_dir``
    and returns the report."""
    common = load("_common")
    usable, why = common.mps_status()
    chip = common.chip_name()
    peak = common.peak_gbps(chip)
    if not usable:
        skipped = [op for op in ops if op in GPU_OPS]
        if skipped:
            out(f"No usable Apple GPU here ({why}): the GPU benchmarks ({', '.join(skipped)}) need an "
                f"Apple-silicon Mac. Running the simulator benchmark only.")
        ops = ["simulator"]
    env = environment(chip, peak, usable, why)
    out(f"{chip or 'no Apple GPU'}, peak {peak or '?'} GB/s, torch {env['torch']}, macOS {env['macos'] or '—'}")
    results = {}
    for op in ops:
        module = load(SCRIPTS[op])
        argv = ["--repeat", str(repeat)] if repeat and op == "simulator" else []
        out(f"\n{op}: {module.TITLE}")
        rows = print_table(module.rows(module.parser().parse_args(argv), chip), module.COLUMNS, out)
        results[op] = {"title": module.TITLE, "device": "cpu (simulator)" if op == "simulator" else "mps",
                       "columns": [asdict(c) for c in module.COLUMNS], "rows": rows}
    report = {"environment": env, "benchmarks": results}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "bench.json").write_text(json.dumps(report, indent=2))
    (out_dir / "bench.md").write_text(markdown(report))
    written = ["bench.json", "bench.md"]
    if plot(report, out_dir / "bench.png"):
        written.append("bench.png")
    else:
        out("(no plot: matplotlib is not installed; pip install matplotlib)")
    out(f"\nwrote {', '.join(str(out_dir / f) for f in written)}")
    return report


def markdown(report: dict) -> str:
    """The report as Markdown: the environment, then one table per benchmark."""
    env = report["environment"]
    lines = ["# mps_ext benchmarks", "", "| | |", "|---|---|"]
    for key, label in (("chip", "chip"), ("peak_gbps", "peak bandwidth used for % peak (GB/s)"),
                       ("macos", "macOS"), ("torch", "torch"), ("mps_ext", "mps_ext"), ("python", "Python"),
                       ("mps", "MPS device"), ("date", "date (UTC)")):
        lines.append(f"| {label} | {env[key] if env[key] is not None else '—'} |")
    for op, bench in report["benchmarks"].items():
        cols = [Column(**c) for c in bench["columns"]]
        lines += ["", f"## {op}: {bench['title']}", "", "| " + " | ".join(c.header for c in cols) + " |",
                  "|" + "|".join("---:" if c.fmt else "---" for c in cols) + "|"]
        lines += ["| " + " | ".join(c.text(row) for c in cols) + " |" for row in bench["rows"]]
        g = geomean(r.get("speedup") for r in bench["rows"])
        if g and any(c.key == "speedup" for c in cols):
            lines += ["", f"Geometric-mean speedup over torch: {g:.2f}x"]
    return "\n".join(lines) + "\n"


def plot(report: dict, path: Path) -> bool:
    """A bar chart of the speedup over torch per case, one panel per benchmark; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    panels = [(op, b, [r for r in b["rows"] if r.get("speedup")]) for op, b in report["benchmarks"].items()]
    panels = [p for p in panels if p[2]]
    if not panels:
        return False
    heights = [0.8 + 0.17 * len(rows) for _, _, rows in panels]
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, sum(heights) + 0.6), squeeze=False,
                             gridspec_kw={"height_ratios": heights})
    for ax, (op, bench, rows) in zip(axes[:, 0], panels):
        speedups = [r["speedup"] for r in rows]
        ax.barh(range(len(rows)), speedups, color=["tab:green" if s >= 1 else "tab:red" for s in speedups])
        ax.set_yticks(range(len(rows)), [r["case"] for r in rows], fontsize=6)
        ax.invert_yaxis()
        ax.set_xscale("log")
        ax.axvline(1.0, color="black", linewidth=0.8)
        ax.set_title(f"{op}: {bench['title']}", fontsize=9)
        ax.set_xlabel("torch CPU time / simulator time" if op == "simulator" else "speedup over torch (log scale)",
                      fontsize=8)
    env = report["environment"]
    fig.suptitle(f"mps_ext on {env['chip'] or 'no Apple GPU'}, torch {env['torch']}, macOS {env['macos'] or '—'}",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ops", default=",".join(GPU_OPS),
                        help=f"comma-separated, of {', '.join(SCRIPTS)} (default: {','.join(GPU_OPS)}; without an "
                             f"Apple GPU only simulator runs)")
    parser.add_argument("--out", default="bench_results", help="directory for bench.json, bench.md, bench.png")
    parser.add_argument("--repeat", type=int, help="repetitions of each simulator case (default 5)")


def main(args: argparse.Namespace) -> int:
    """``python -m mps_ext bench``."""
    ops = [op.strip() for op in args.ops.split(",") if op.strip()]
    unknown = [op for op in ops if op not in SCRIPTS]
    if unknown:
        print(f"--ops: unknown {', '.join(unknown)} (choose from {', '.join(SCRIPTS)})", file=sys.stderr)
        return 2
    run(ops, Path(args.out), repeat=args.repeat)
    return 0
