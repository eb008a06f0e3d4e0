"""The Markdown report of a CUDA check run (run.py writes it from its JSON)."""

from __future__ import annotations

import re

# The planted kernel (planted.metal) each sanitizer must flag: run.py runs them, the report says whether it did.
CONTROL = {"racecheck": "planted_race", "synccheck": "planted_divergent_barrier", "memcheck": "planted_oob"}

# Why a kernel stays below half the copy bandwidth at a large shape, by case
# name pattern: stated after reading the run, so a reader knows whether the
# figure is a flaw to fix or a property of the case.
REASONS = [
    (r"softmax \(256, 151936\)",
     "latency, not bytes: partials and finalize take about as long in bf16 as in fp32 (per-launch times); "
     "each thread handles only 8 elements and each of the 19200 threadgroups ends in two threadgroup "
     "reductions (~36 waves of short threadgroups); finalize re-reads the row (1.5x the minimal traffic). "
     "Flag: more elements per thread"),
    (r"softmax \(16384, 4096\)",
     "one 1024-thread threadgroup per row, one 4-element load per thread, then two reductions over 32 SIMD "
     "groups with barriers; one such threadgroup fits an SM at a time: latency-bound"),
    (r"softmax \(2097152, 64\)",
     "a SIMD group per 64-element row: half its lanes idle, 128 bytes per SIMD group"),
    (r"dim=1",
     "too little parallelism: one thread per column, 8192 threads = 32 threadgroups for 132 SMs, each walking "
     "4096 elements twice in sequence (torch is as slow). The host moves the dimension last only below 1024 "
     "columns"),
    (r"^linear m=1 n=14336 k=4096 (fp16|bf16)",
     "at the border (43-51% over five runs; torch's GEMV 48-62% in the same runs): 4 x 16-byte loads in flight "
     "per lane, 8 threadgroups per SM"),
    (r"^linear m=8 ",
     "each step a lane issues 8 x-row loads (from cache) beside its 4 weight loads and 256 FMAs; 127 registers, "
     "4 threadgroups per SM: instruction-bound at m=8"),
    (r"^linear m=1 n=4096 k=14336",
     "at the border, as torch is; docs/performance.md, which times CUDA graphs of many calls with inputs rotated "
     "through 4x the L2, has this shape at 90% of copy bandwidth"),
    (r"^linear m=1 n=128 k=7168", "1.8 MB, L2-resident, 32 threadgroups: launch-bound (torch alike)"),
    (r"W stored k-major",
     "too little parallelism: a threadgroup per 512 bytes of columns, at most 8 SIMD groups splitting K, so 24 "
     "threadgroups (192 SIMD groups) for 132 SMs; an M1's 8 cores hold about that many. Not yet timed against "
     "a peer (MLX's gemv_t)"),
    (r"scaled_mm m=(1|8) |fp8_linear m=(1|4) ",
     "the e4m3 decode (shift trick, half-to-float conversions, a NaN test per 4 bytes) costs more "
     "instructions per weight byte than its transfer on this GPU; at m = 1 the weights stream past the row "
     "held in registers (docs/performance.md, timing CUDA graphs of many calls, has these shapes at "
     "0.58-0.70x our bf16 GEMV); the m >= 2 variants keep 16-136 bytes of stack (cuobjdump). torch's own fp8 "
     "GEMV (_scaled_mm) is no faster"),
    (r"scaled_mm m=512|fp8_linear m=256|grouped_mm rows|fp8_grouped_mm G=128 m=4096 ",
     "compute-bound tiles, and simdgroup_matrix is emulated with warp shuffles here (correctness, not speed)"),
    (r"fp8.quantize",
     "two kernels (amax reads x, quantize re-reads it: 1.5x the minimal traffic) and one element per thread: "
     "2-byte loads and 1-byte stores, no vector accesses. Flag: several elements per thread"),
    (r"fp8.dequantize", "one element per thread: 1-byte loads and 2-byte stores, no vector accesses"),
    (r"fp8_grouped_mm G=128 m=(8|32) ",
     "8 or 32 routed rows take a few tens of microseconds, latency as much as bytes, as for grouped_mm's "
     "decode, and the e4m3 decode's instructions as for fp8_linear; docs/performance.md times CUDA graphs of "
     "such calls beside our bf16 decode"),
    (r"grouped_mm decode",
     "8 or 32 routed rows take a few tens of microseconds, latency as much as bytes (torch alike); "
     "docs/performance.md times CUDA graphs of such calls beside MLX's and ggml's kernels. At m = 1024 runs of 8 "
     "rows read their expert's weights once each, so an expert with more rows reads them again"),
    (r"^solve_triangular batch=4096 n=4 ",
     "4096 systems of order 4 are a few hundred KB: launch-bound, and a SIMD group per right-hand side keeps 4 "
     "of its 32 lanes busy"),
    (r"batch=4096 n=4 ",
     "4096 systems of order 4 are a few hundred KB: 64 threadgroups (a thread per system) for 132 SMs, "
     "launch-bound (torch slower still)"),
    (r"^qr batch=4096 ",
     "latency-bound: one SIMD group per matrix steps through its reflectors one after another, each a "
     "column sum and a broadcast across the SIMD group before the next can start (4 x 4 matrices: a few "
     "hundred KB in all, launch-bound)"),
    (r"^pad constant .* \(1, 1, 1, 1, 2, 0\)|^pad reflect \(8, 256, 128, 128\)",
     "the width padded by one on each side: output rows (834 or 130 elements) are not 16-byte aligned; each "
     "thread stores 16 aligned bytes and reads an interior run with two aligned loads shifted into place, and "
     "only chunks at a row's ends gather element by element (2 in 105 of Wan's rows, 3 in 16 of the UNet's)"),
    (r"^pad backward",
     "each thread writes 16 bytes of the gradient: an interior chunk is one aligned load or two shifted into "
     "place (the output's rows of 130 or 210 elements are not aligned), a chunk on a border (2 of a row's 16 or "
     "52, and whole border rows and frames) gathers element by element through tables in thread memory"),
    (r"^upsample",
     "nearest by a power of two: each thread loads 16 bytes once and stores them at every copy "
     "(upsample_repeat); the other modes compute one position and 4 channels per thread, with 2- or 4-byte "
     "accesses"),
    (r"^attention 1x32/8 heads q (1|4) ",
     "decode: a threadgroup per KV head and block of keys, then a merge launch over the blocks (a threadgroup "
     "of 4 SIMD groups per output row, taking the blocks in turn); at 4 query rows per head 128 floats of "
     "accumulators per lane"),
    (r"^attention .*q 1024|^attention backward",
     "tiles of simdgroup_matrix products, which are emulated with warp shuffles here (correctness, not "
     "speed)"),
    (r"batch=4096 n=(32|64) ",
     "latency-bound: a SIMD group (trsm_inverse: a threadgroup) per system steps through n dependent "
     "pivot/substitution steps with barriers or broadcasts"),
]


def reason(name: str) -> str:
    for pattern, why in REASONS:
        if re.search(pattern, name):
            return why
    return ""


def _verdict(san: dict, tool: str, kernel: str) -> str:
    r = san.get(tool)
    if not r or "errors" not in r:
        return "not run"
    errs = r["errors"]
    if kernel not in errs:
        return "not launched" if r.get("completed") else "not reached"
    return "clean" if not errs[kernel] else f"**{len(errs[kernel])} error(s)**"


def clocks_text(info: dict) -> str:
    """The clocks of a report's info, as a phrase: where the card was running and could run."""
    c = info.get("clocks")
    if not c:
        return "clocks not read"
    return (f"SM clock {c['clocks.sm']} of {c['clocks.max.sm']} MHz, memory {c['clocks.mem']} of "
            f"{c['clocks.max.mem']} MHz at the start")


def render(res: dict) -> str:
    info, san = res["info"], res.get("sanitizers", {})
    copy = info.get("copy_gbs", 0.0)
    L = ["# CUDA check of the Metal kernels", "",
         "Generated by `tools/cuda_check/run.py`: every `metal/*.metal` file translated to CUDA "
         "(`tools/cuda_check/translate_cuda.py`), compiled with nvcc for sm_90 and launched as the host plans "
         "it: each case runs the mps_ext op on CPU tensors inside `mps_ext.sim.record_launches` (`csrc/ops` "
         "chooses kernels, grids and parameter structs, sized for this GPU: its SMs × the warps of each kernel "
         "one SM keeps resident), and the recorded launches run here on GPU copies of the buffers they bind "
         "(`tools/cuda_check/replay.py`).", "",
         "**These are flags, not Apple numbers.** A CUDA GPU runs the kernels' SIMT logic in 32-lane warps "
         "(Apple's SIMD-group width) and compute-sanitizer checks their memory and barrier discipline; the "
         "bandwidth ratios point at serialisation, too little parallelism or missing vector loads. They do not "
         "predict times on an M-series GPU (other caches, other memory system; simdgroup_matrix is emulated "
         "with shuffles here).", "",
         f"Device: {info.get('device')} ({info.get('sms')} SMs; {clocks_text(info)}), torch {info.get('torch')} (CUDA "
         f"{info.get('cuda')}); measured device-to-device copy bandwidth {copy:.0f} GB/s (bytes read + "
         f"written). Whole run: {info.get('seconds')} s.", ""]

    # Controls
    L += ["## Sanitizer controls (planted bugs)", "",
          "| tool | planted kernel | flagged | tool run |", "| --- | --- | --- | --- |"]
    for tool, kernel in CONTROL.items():
        r = san.get(tool, {})
        errs = r.get("errors", {}).get(kernel)
        flagged = "yes" if errs else ("no" if errs is not None else "not reached")
        L.append(f"| {tool} | `{kernel}` | {flagged} | rc {r.get('rc')}, {r.get('seconds')} s, "
                 f"{'; '.join(r.get('summary', [])) or '-'} |")
    unattributed = {t: r.get("errors", {}).get("__unattributed__") for t, r in san.items()}
    if any(unattributed.values()):
        L += ["", f"Errors before any kernel marker: {unattributed}"]
    L.append("")

    # Per kernel
    small = res.get("small", [])
    per = {}
    for r in small + res.get("large", []):
        for k in r["kernels"]:
            per.setdefault(k, []).append(r["ok"])
    L += ["## Every kernel: correctness and sanitizers", "",
          "Correctness: cases (odd sizes, NaN/inf rows, every dtype; plus the model sizes below) whose output "
          "matches a float64 reference within the dtype's tolerance, every output element written (outputs "
          "are poisoned with NaN first). Sanitizers ran over the small cases.", "",
          "memcheck ran with every tensor its own allocation and padding between allocations; an overrun "
          "that stays inside torch's rounding of a tensor's size (512 bytes) is not seen.", "",
          "Registers, stack bytes and threadgroup (shared) bytes are cuobjdump's. A kernel with SIMD-group "
          "reductions reserves 128 stack bytes for the shim's exact partial-SIMD-group path (not taken when "
          "the whole SIMD group is active); more than that means a thread-private array went to local memory.",
          "",
          "| file | kernel | correct | racecheck | synccheck | memcheck | regs | stack | shared |",
          "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    usage = res.get("usage", {})
    for stem, names in res["kernels"].items():
        for k in names:
            oks = per.get(k, [])
            corr = f"{sum(oks)}/{len(oks)}" if oks else "**not run**"
            if oks and not all(oks):
                corr = f"**{corr}**"
            L.append(f"| {stem} | `{k}` | {corr} | " + " | ".join(_verdict(san, t, k) for t in
                                                                  ("racecheck", "synccheck", "memcheck")) +
                     " | " + " | ".join(str(usage.get(k, {}).get(f, "?")) for f in ("REG", "STACK", "SHARED")) + " |")
    L.append("")

    # Model sizes
    sms = info.get("sms") or 1
    L += ["## Model sizes: parity and bandwidth", "",
          "GB/s counts the fewest bytes the op must move (each input read once, each output written once) over "
          "the median time of repeated launches; % is of the measured copy bandwidth. torch: its own CUDA op "
          "on the same inputs in the same run. Threadgroups: per launch, `launched of threads-each / SMs × "
          "threadgroups one SM holds at once` (CUDA's occupancy for the kernel's registers and threadgroup "
          "memory), with each launch's own time when a case has several.", "",
          "| case | kernels | correct | ms | GB/s | % copy | torch GB/s | torch % | threadgroups / SMs | note |",
          "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in res.get("large", []):
        pct = r.get("pct_copy")
        if r.get("launches"):
            tg = ", ".join(f"{l['threadgroups']} of {l['threads']} / {sms}×{l['resident_per_sm']}"
                           + (f" ({l['ms']:.3f} ms)" if "ms" in l else "") for l in r["launches"])
        else:
            tg = ", ".join(f"{t} / {sms}" for t in r["threadgroups"])
        tgbs = r.get("torch_gbs")
        note = []
        if r.get("tflops"):
            note.append(f"{r['tflops']:.1f} TFLOP/s")
        if pct is not None and pct < 50:
            why = reason(r["name"])
            note.append(f"**< 50%**: {why or 'no reason stated'}")
        if r.get("torch_note"):
            note.append(r["torch_note"])
        L.append(f"| {r['name']} | {', '.join('`' + k + '`' for k in r['kernels'])} | "
                 f"{'yes' if r['ok'] else '**NO**'}: {r['msg']} | {r.get('ms', float('nan')):.3f} | "
                 f"{r.get('gbs', 0):.0f} | {pct or 0:.0f}% | {tgbs or 0:.0f} | {100 * (tgbs or 0) / copy:.0f}% | {tg} | "
                 f"{'; '.join(note)} |")
    launched = set(res.get("launched", []))
    missing = [k for names in res["kernels"].values() for k in names if k not in launched]
    L += ["", f"Kernels never launched: {', '.join(missing) if missing else 'none'}.", ""]
    return "\n".join(L)


def main():
    import argparse
    import json
    from pathlib import Path

    ap = argparse.ArgumentParser(description="Render the report of a CUDA check run from its JSON.")
    ap.add_argument("json", type=Path)
    ap.add_argument("-o", "--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.write_text(render(json.loads(args.json.read_text())))


def summary(res: dict) -> str:
    small, large = res.get("small", []), res.get("large", [])
    bad = [r["name"] for r in small + large if not r["ok"]]
    san = res.get("sanitizers", {})
    flagged = {t: sorted(k for k, v in r.get("errors", {}).items() if v) for t, r in san.items() if "errors" in r}
    lines = [f"sweep {sum(r['ok'] for r in small)}/{len(small)} ok, model sizes {sum(r['ok'] for r in large)}/"
             f"{len(large)} ok; failures: {bad}", f"sanitizers flagged: {flagged}"]
    for r in large:
        lines.append(f"{r['name'][:60]:60s} {r.get('gbs', 0):7.0f} GB/s {r.get('pct_copy') or 0:4.0f}%  torch "
                     f"{r.get('torch_gbs', 0):7.0f}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
