"""Times our decode kernels beside llama.cpp's ggml-metal and MLX's on one CUDA GPU.

Every code base's Metal is translated by tools/cuda_check/translate_cuda.py and launched with its own
host's plan (ours: peer_cases.our_plan; the peers': peer_plans.py), checked against a float64 reference
and timed with torch CUDA beside it, every case twice (two whole passes). Writes the tables of
docs/performance.md. Needs nvcc, a CUDA GPU, torch with CUDA and the peers' sources (see
tools/cuda_check/README.md).

    python3 tools/cuda_check/peers.py --peers DIR --out OUT
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

import peer_cases  # noqa: E402
import peer_report  # noqa: E402
import peer_sources  # noqa: E402
import peer_torch  # noqa: E402
from cases import TOL, rel_err  # noqa: E402
from cuda import Launcher, build  # noqa: E402
from peer_plans import Ggml  # noqa: E402
from run import copy_bandwidth, device_info, load_all  # noqa: E402
from translate_cuda import ROOT  # noqa: E402

PASSES = 2


def log(*a):
    print(*a, flush=True)


def measure_on(launcher, reps: int, target_ms: float):
    """measure(impl) for run_passes: check set 0's output, then the median µs of one call, from CUDA graphs
    of many calls that cycle through the input sets."""

    def calls(impl):
        return [run if callable(run) else (lambda launches=run: launcher.run(launches)) for run in impl.runs]

    def time_us(fns) -> float:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up off the capture stream, as graph capture wants
            for _ in range(2):
                for f in fns:
                    f()
        torch.cuda.current_stream().wait_stream(side)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for f in fns:
            f()
        end.record()
        end.synchronize()
        n = max(len(fns), min(2000, math.ceil(target_ms / max(start.elapsed_time(end) / len(fns), 1e-3))))
        n = -(-n // len(fns)) * len(fns)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for i in range(n):
                fns[i % len(fns)]()
        graph.replay()
        times = []
        for _ in range(reps):
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1000 / n)
        return statistics.median(times)

    def measure(impl) -> dict:
        for t in impl.poison:
            t.fill_(float("nan"))
        fns = calls(impl)
        fns[0]()
        torch.cuda.synchronize()
        err = rel_err(impl.output(), impl.ref)
        rec = {"rel_err": err, "ok": err <= TOL[impl.dtype]}
        if rec["ok"]:
            rec["us"] = time_us(fns)
        return rec

    return measure


def run_passes(cases, implementations, measure, passes=PASSES, log=log) -> list[dict]:
    """Every case's implementations, checked and timed in each of `passes` whole passes over the cases:
    [{family, name, impls: {name: {bytes, note, kernels, threadgroups, ok, rel_err: [per pass], us: [...]}}}];
    an implementation that cannot express its case: {na: why}."""
    rows = [{"family": c.family, "name": c.name, "impls": {}} for c in cases]
    for p in range(passes):
        log(f"pass {p + 1}:")
        for case, row in zip(cases, rows):
            try:
                impls = implementations(case)
            except Exception as e:  # noqa: BLE001 - one case's failure is reported, the run goes on
                traceback.print_exc()
                row["error"] = f"{type(e).__name__}: {e}"
                continue
            for impl in impls:
                if impl.not_applicable:  # a peer that cannot express the case: said so, nothing runs
                    row["impls"].setdefault(impl.name, {"na": impl.not_applicable, "ok": False, "us": []})
                    continue
                rec = row["impls"].setdefault(impl.name, {
                    "bytes": impl.bytes, "note": impl.note, "ok": True, "rel_err": [], "us": [],
                    "kernels": [l.kernel for l in impl.runs[0]] if not callable(impl.runs[0]) else [],
                    "threadgroups": [l.grid for l in impl.runs[0]] if not callable(impl.runs[0]) else []})
                try:
                    got = measure(impl)
                except Exception as e:  # noqa: BLE001
                    traceback.print_exc()
                    got = {"ok": False, "rel_err": float("nan"), "error": f"{type(e).__name__}: {e}"}
                rec["ok"] &= got["ok"]
                rec["rel_err"].append(got["rel_err"])
                rec["us"].append(got.get("us"))
                if "error" in got:
                    rec["error"] = got["error"]
                log(f"  {case.family} {case.name:28s} {impl.name:6s} {got.get('us') or float('nan'):9.2f} us  "
                    f"rel err {got['rel_err']:.1e} {'ok' if got['ok'] else 'WRONG'}")
            del impls
            torch.cuda.empty_cache()
    return rows


def commit() -> str | None:
    """The checkout's commit, when it is a git checkout; said to differ where tracked files do (a copy of a
    working tree can carry an older .git than its files)."""
    git = lambda *a: subprocess.run(["git", "-C", str(ROOT), *a], capture_output=True, text=True).stdout.strip()
    head = git("rev-parse", "--short", "HEAD")
    if head and git("status", "--porcelain", "--untracked-files=no"):
        return f"{head} with tracked files changed"
    return head or None


def load(build_dir: Path, peers: Path):
    """Builds ours (run.load_all, which also sets the fill our recorded plans take for this GPU) and the peers'
    modules."""
    driver, _, _ = load_all(build_dir)
    modules = peer_sources.modules(peers, build_dir / "peers")
    if peer_torch.SOURCES is not None:  # torch's own kernels (--torch-mps DIR)
        modules += peer_torch.modules(peer_torch.SOURCES, build_dir / "peers")
    for module, cubin in zip(modules, build(modules, build_dir, log=log).values()):
        driver.load(module.name, cubin, module.hosts(), prefix=module.name + "/")
    return driver


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peers", type=Path, required=True, help="the peers' sources: DIR/ggml, DIR/mlx")
    ap.add_argument("--torch-mps", type=Path, help="torch's Metal sources (peer_torch.py extract): its own "
                    "kernels as a peer; without it their cells are n/a")
    ap.add_argument("--out", type=Path, default=Path("peers_out"), help="for peers.json and peers.md")
    ap.add_argument("--build", type=Path, default=Path("/tmp/cuda_check_build"),
                    help="translations and cubins (reused while they are the same)")
    ap.add_argument("--families", default=",".join(peer_cases.IMPLEMENTATIONS),
                    help="tables to make (default: all)")
    ap.add_argument("--reps", type=int, default=25, help="timed replays of each graph")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    peer_torch.SOURCES = args.torch_mps
    t0 = time.time()
    launcher = Launcher(load(args.build, args.peers))
    info = {**device_info(), "copy_gbs": copy_bandwidth(), "commit": commit()}
    log(f"{info['device']}, {info['sms']} SMs; copy {info['copy_gbs']:.0f} GB/s")
    families = args.families.split(",")
    cases = [c for c in peer_cases.cases() if c.family in families]
    ggml = Ggml(args.peers)
    torch.manual_seed(0)
    rows = run_passes(cases, lambda c: peer_cases.implementations(c, ggml),
                      measure_on(launcher, args.reps, target_ms=3.0))
    info["seconds"] = round(time.time() - t0)
    result = {"info": info, "cases": rows}
    (args.out / "peers.json").write_text(json.dumps(result, indent=1))
    (args.out / "peers.md").write_text(peer_report.render(result))
    log(f"wrote {args.out / 'peers.md'} ({info['seconds']} s)")


if __name__ == "__main__":
    main()
