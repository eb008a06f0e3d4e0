"""Run every shipped Metal kernel on a CUDA GPU: build (MSL -> CUDA -> cubin),
the correctness sweep at odd sizes (every host name), parity and bandwidth at
real model sizes against torch's CUDA ops, compute-sanitizer racecheck,
synccheck and memcheck over the sweep, planted-bug controls, and a Markdown
report. The launches are the host's own (mps_ext's ops recorded on the CPU,
replayed here). Not part of the package; needs nvcc, compute-sanitizer, torch
with CUDA and mps_ext built against that torch (see tools/cuda_check/README.md).

    python3 tools/cuda_check/run.py --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[2]))  # this checkout's mps_ext, built in place
if "--dry-run" in sys.argv:
    os.environ["CUDA_CHECK_DEVICE"] = "cpu"

import torch  # noqa: E402

import cases as C  # noqa: E402
import report  # noqa: E402
from report import CONTROL  # noqa: E402
import replay  # noqa: E402
from cuda import Driver, Launch, Launcher, build, env_no_caching, resource_usage, u32s  # noqa: E402
from translate_cuda import ROOT, translate  # noqa: E402

HERE = Path(__file__).resolve().parent
SOURCES = sorted((ROOT / "metal").glob("*.metal"))
PLANTED = HERE / "planted.metal"
TOOLS = ("racecheck", "synccheck", "memcheck")
MARK = "@@kernel "
# Marks what a case runs of torch's own on the GPU (its reference): the sanitizers' reports there are not ours.
TORCH = "__torch__"


def log(*a):
    print(*a, flush=True)


def host_names() -> dict[str, list[str]]:
    return {src.stem: [e.host for e in translate(src, [ROOT / "metal" / "include"])[1]] for src in SOURCES}


def load_all(build_dir: Path, with_planted=False):
    srcs = SOURCES + ([PLANTED] if with_planted else [])
    cubins = build(srcs, build_dir, log=log)
    drv = Driver()
    names = {}
    for src in srcs:
        names[src.stem] = [e.host for e in translate(src, [ROOT / "metal" / "include"])[1]]
        drv.load(src.stem, cubins[src.stem], names[src.stem])
    # The host plans this GPU as the Metal backend plans an Apple GPU: every SM with the warps it keeps resident.
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    replay.fill_simdgroups = lambda kernel, threads: sms * drv.resident(kernel, threads) * threads // 32
    return drv, names, cubins


def run_case(launcher: Launcher, case: C.Case) -> dict:
    try:
        launcher.run(case.replay.launches)
        torch.cuda.synchronize()
        case.replay.download()
        if launcher.trace:
            launcher.trace(TORCH)
        ok, msg = case.check()
    except Exception as e:  # noqa: BLE001 - a failing case is reported, the run goes on
        ok, msg = False, f"{type(e).__name__}: {e}"
        traceback.print_exc()
    return {"family": case.family, "name": case.name, "ok": bool(ok), "msg": msg,
            "kernels": sorted({l.kernel for l in case.replay.launches}),
            "threadgroups": [l.threadgroups for l in case.replay.launches]}


def time_ms(fn, reps=50) -> float:
    """Median of CUDA-event timings (after warm-up); inputs are far larger than L2 where it matters."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    return statistics.median(times)


# nvidia-smi's fields for the card's clocks when the run starts: SM and memory now, and their maxima.
CLOCKS = ("clocks.sm", "clocks.max.sm", "clocks.mem", "clocks.max.mem")


def device_info() -> dict:
    """The card (name, SMs, its clocks in MHz as nvidia-smi reads them, or None without it) and the software."""
    props = torch.cuda.get_device_properties(0)
    try:
        line = subprocess.run(["nvidia-smi", "-i", "0", f"--query-gpu={','.join(CLOCKS)}", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=30).stdout.strip()
        clocks = dict(zip(CLOCKS, (int(v) for v in line.split(","))))
    except (OSError, ValueError, subprocess.SubprocessError):
        clocks = None
    return {"device": props.name, "sms": props.multi_processor_count, "clocks": clocks, "torch": torch.__version__,
            "cuda": torch.version.cuda}


def copy_bandwidth() -> float:
    """GB/s of a device-to-device copy of 4 GiB (bytes read + written)."""
    src = torch.empty(1 << 30, dtype=torch.float32, device="cuda").uniform_()
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), reps=20)
    del src, dst
    return 2 * (1 << 32) / ms / 1e6


def sweep(launcher, families, only_kernels=None):
    results = []
    for fam in families:
        torch.manual_seed(0)
        for case in C.SMALL[fam]():
            results.append(run_case(launcher, case))
            log(f"  [{'ok' if results[-1]['ok'] else 'FAIL'}] {case.name}: {results[-1]['msg']}")
    return results


def run_controls(drv: Driver, launcher: Launcher, tool: str):
    out = torch.zeros(256, device="cuda")
    name = CONTROL[tool]
    if tool == "memcheck":
        # Its own allocation of exactly 200 floats: torch rounds sizes up, which would hide the overrun.
        launches = [Launch(name, (1,), (200,), [drv.alloc(200 * 4), u32s(200)])]
    elif tool == "synccheck":
        launches = [Launch(name, (1,), (64,), [out])]
    else:
        launches = [Launch(name, (1,), (256,), [out])]
    try:
        launcher.run(launches)
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - the sanitizer may abort the planted kernel
        log(f"control {name}: {type(e).__name__}: {e}")


def sanitize_child(args):
    """Inside compute-sanitizer: the sweep with a marker before each launch, then the tool's control."""
    drv, _, _ = load_all(args.build, with_planted=True)
    launcher = Launcher(drv, trace=lambda k: log(MARK + k))
    families = args.families.split(",")
    sweep(launcher, families)
    log(MARK + CONTROL[args.sanitize])
    run_controls(drv, launcher, args.sanitize)
    torch.cuda.synchronize()
    time.sleep(1)  # reports of the control's last launch come before the end marker
    log(MARK + "__end__")


def sanitizer_path() -> str | None:
    for cand in (shutil.which("compute-sanitizer"), "/usr/local/cuda/bin/compute-sanitizer",
                 *sorted(Path("/usr/local").glob("cuda*/bin/compute-sanitizer"))):
        if cand and Path(cand).exists():
            return str(cand)
    return None


_ERROR = re.compile(r"^========= (?:Error|Warning|Invalid|Race|Barrier|.*hazard|.*error)", re.I)


def parse_sanitizer(text: str) -> dict[str, list[str]]:
    """{host name: its error lines} from a marked log; '__unattributed__' for errors before any marker, none for torch's."""
    found: dict[str, list[str]] = {}
    current = "__unattributed__"
    for line in text.splitlines():
        if line.startswith(MARK):
            if line[len(MARK):].strip() != "__end__":  # late reports belong to the last kernel
                current = line[len(MARK):].strip()
                if current != TORCH:
                    found.setdefault(current, [])
            continue
        if current != TORCH and line.startswith("=========") and _ERROR.match(line) and "ERROR SUMMARY" not in line:
            found.setdefault(current, []).append(line.strip())
    return found


def run_sanitizers(args, out_dir: Path) -> dict:
    tool_path = sanitizer_path()
    if not tool_path:
        return {"error": "compute-sanitizer not found"}

    def one(tool):
        cmd = [tool_path, "--tool", tool, "--print-limit", "200", "--show-backtrace", "no"]
        if tool == "memcheck":
            cmd += ["--padding", "1024"]  # no allocation directly after another
        if tool == "racecheck":
            cmd += ["--racecheck-report", "all"]
        cmd += [sys.executable, str(HERE / "run.py"), "--sanitize", tool, "--build", str(args.build),
                "--families", args.families]
        t0 = time.time()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env_no_caching(),
                                  timeout=args.sanitize_timeout)
            text, rc = proc.stdout + proc.stderr, proc.returncode
        except subprocess.TimeoutExpired as e:
            text, rc = (e.stdout or b"").decode(errors="replace") + "\n[timed out]", -1
        (out_dir / f"sanitizer_{tool}.log").write_text(text)
        return tool, {"rc": rc, "seconds": round(time.time() - t0, 1), "errors": parse_sanitizer(text),
                      "completed": MARK + "__end__" in text,
                      "summary": [l for l in text.splitlines() if "ERROR SUMMARY" in l or "RACECHECK SUMMARY" in l]}

    with ThreadPoolExecutor(max_workers=len(TOOLS)) as pool:
        return dict(pool.map(one, TOOLS))


def large_cases(launcher, families, copy_gbs, reps):
    rows = []
    for fam in families:
        torch.manual_seed(1)
        for case in C.LARGE[fam]():
            r = run_case(launcher, case)
            try:
                ms = time_ms(lambda: launcher.run(case.replay.launches), reps)
                r["ms"] = ms
                r["gbs"] = case.bytes / ms / 1e6
                r["tflops"] = case.flops / ms / 1e9 if case.flops else None
                if case.torch_fn:
                    tms = time_ms(case.torch_fn, reps)
                    r["torch_ms"] = tms
                    r["torch_gbs"] = case.bytes / tms / 1e6
            except Exception as e:  # noqa: BLE001
                r["msg"] += f"; timing failed: {type(e).__name__}: {e}"
            # Per launch: threadgroups, how many an SM holds at once, and its own time when there are several.
            r["launches"] = []
            for l in case.replay.launches:
                threads = 1
                for t in l.threads:
                    threads *= t
                entry = {"kernel": l.kernel, "threadgroups": l.threadgroups, "threads": threads,
                         "resident_per_sm": launcher.driver.resident(l.kernel, threads)}
                if len(case.replay.launches) > 1:
                    entry["ms"] = time_ms(lambda: launcher.run([l]), reps)
                r["launches"].append(entry)
            r["bytes"] = case.bytes
            r["torch_note"] = case.torch_note
            r["pct_copy"] = 100 * r["gbs"] / copy_gbs if "gbs" in r else None
            rows.append(r)
            log(f"  [{'ok' if r['ok'] else 'FAIL'}] {case.name}: {r['msg']}; "
                f"{r.get('ms', float('nan')):.3f} ms, {r.get('gbs', 0):.0f} GB/s "
                f"({r.get('pct_copy') or 0:.0f}% of copy), torch {r.get('torch_gbs', 0):.0f} GB/s; "
                f"threadgroups {r['threadgroups']}")
            del case
            torch.cuda.empty_cache()
    return rows


def dry_run(families) -> tuple[list[str], list[str]]:
    """Every small case on the CPU: its recording run in the simulator instead of on CUDA, then its check
    (every launched name must be a host name of the translation). Returns the failed checks, and the host
    names no case launched (of every family: meaningful when `families` are all of them)."""
    names = {k for n in host_names().values() for k in n}
    used, failed = set(), []
    for fam in families:
        torch.manual_seed(0)
        for case in C.SMALL[fam]():
            for l in case.replay.launches:
                if l.kernel not in names:
                    raise SystemExit(f"{case.name}: no kernel {l.kernel}")
                used.add(l.kernel)
            case.replay.recording.replay()
            ok, msg = case.check()
            if not ok:
                failed.append(f"{case.name}: {msg}")
    never = sorted(names - used)
    log(f"dry run: {len(used)} of {len(names)} kernels launched by the sweep; never: {never}")
    return failed, never


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("cuda_check_out"))
    ap.add_argument("--build", type=Path, default=Path("/tmp/cuda_check_build"))
    ap.add_argument("--families", default=",".join(C.SMALL))
    ap.add_argument("--sanitize", choices=TOOLS, help=argparse.SUPPRESS)
    ap.add_argument("--sanitize-timeout", type=int, default=300)
    ap.add_argument("--no-sanitize", action="store_true")
    ap.add_argument("--no-large", action="store_true")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--dry-run", action="store_true",
                    help="no GPU: every small case recorded, run in the simulator and checked")
    args = ap.parse_args()
    if args.dry_run:
        failed, _ = dry_run(args.families.split(","))
        if failed:
            raise SystemExit("dry run: checks failed in the simulator:\n  " + "\n  ".join(failed))
        return None
    if args.sanitize:
        return sanitize_child(args)
    args.out.mkdir(parents=True, exist_ok=True)
    families = args.families.split(",")
    t0 = time.time()
    log("build:")
    drv, names, cubins = load_all(args.build, with_planted=True)
    log(f"  built in {time.time() - t0:.0f} s")
    usage = {}
    for cubin in cubins.values():
        usage.update(resource_usage(cubin))
    launcher = Launcher(drv)
    # The sanitizers run beside the (untimed) sweep, and are done before anything is timed.
    pool = ThreadPoolExecutor(max_workers=1)
    san_future = None if args.no_sanitize else pool.submit(run_sanitizers, args, args.out)
    log("correctness sweep (small, odd sizes):")
    small = sweep(launcher, families)
    san = {}
    if san_future:
        log("waiting for the sanitizers ...")
        san = san_future.result()
        for tool, r in san.items():
            log(f"  {tool}: rc {r.get('rc')}, {r.get('seconds')} s, completed {r.get('completed')}, "
                f"flagged {sorted(k for k, v in r.get('errors', {}).items() if v)}")
    info = device_info()
    info["copy_gbs"] = copy_bandwidth()
    log(f"device {info['device']}, {info['sms']} SMs; copy bandwidth {info['copy_gbs']:.0f} GB/s")
    large = []
    if not args.no_large:
        log("model sizes:")
        large = large_cases(launcher, families, info["copy_gbs"], args.reps)
    info["seconds"] = round(time.time() - t0)
    all_names = {stem: n for stem, n in names.items() if stem != PLANTED.stem}
    result = {"info": info, "small": small, "large": large, "sanitizers": san, "kernels": all_names, "usage": usage,
              "launched": sorted(launcher.launched)}
    (args.out / "cuda_check.json").write_text(json.dumps(result, indent=1, default=str))
    (args.out / "cuda_check.md").write_text(report.render(result))
    log(report.summary(result))


if __name__ == "__main__":
    main()
