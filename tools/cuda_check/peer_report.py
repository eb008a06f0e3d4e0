"""The tables of docs/performance.md from a run of tools/cuda_check/peers.py (its peers.json).

    python3 tools/cuda_check/peer_report.py OUT/peers.json -o OUT/peers.md
"""

from __future__ import annotations

import statistics

from report import clocks_text

PEERS = [("ggml", "ggml"), ("mlx", "MLX")]
# torch 2.15's own Metal kernels (peer_torch.py; n/a without peers.py --torch-mps DIR).
TORCH_MPS = ("torch_mps", "torch-mps 2.15")
METAL_PEERS = ["ggml", "mlx", TORCH_MPS[0]]
# family: (heading, what the table holds, columns (implementation, title), the ratio's title and its
# denominators; ours over the fastest of them)
TABLES = {
    "gemv": ("Decode GEMV (Llama-3-8B shapes)", "",
             [("ours", "ours"), *PEERS, TORCH_MPS, ("torch", "torch CUDA")], ("÷ best peer", METAL_PEERS)),
    "fp8": ("FP8 decode (`fp8_linear`, Llama-3-8B shapes)",
            "e4m3fn weights with one scale per output row, bf16 activations and output, beside our bf16 GEMV "
            "and cuBLAS on the same weights dequantized; GB/s counts one byte per weight. ggml-metal and MLX "
            "have no e4m3 GEMV to compare with.",
            [("ours", "fp8_linear"), ("bf16", "bf16 GEMV"), TORCH_MPS, ("torch", "torch CUDA bf16")],
            ("÷ bf16 GEMV", ["bf16"])),
    "moe": ("MoE decode (Qwen3-30B-A3B experts: 128, top-8, bf16)",
            "T tokens route T × 8 rows; GB/s counts the distinct active experts' weights once, averaged over the "
            "eight routings each case rotates through.",
            [("ours", "ours"), *PEERS, TORCH_MPS, ("torch", "torch CUDA")], ("÷ best peer", METAL_PEERS)),
    "moe_fp8": ("FP8 MoE decode (`fp8_grouped_mm`, the same experts in e4m3fn)",
                "One scale per row, bf16 activations, beside our bf16 decode on the same routing.",
                [("ours", "fp8_grouped_mm"), ("bf16", "bf16 decode")], ("÷ bf16", ["bf16"])),
    "moe_kn": ("MoE decode, experts stored (E, K, N) (gpt-oss, top-4, bf16)",
               "gate_up (E, 2880, 5760), down (E, 2880, 2880), passed to `torch._grouped_mm` as they are. No "
               "peer runs this layout (llama.cpp converts the experts to (E, N, K) when it writes a GGUF).",
               [("ours", "ours"), ("torch", "torch CUDA")], ("÷ torch", ["torch"])),
    "softmax": ("Softmax", "ggml's softmax takes float32 only.",
                [("ours", "ours"), *PEERS, TORCH_MPS, ("torch", "torch CUDA")], ("÷ best peer", METAL_PEERS)),
    "pad": ("Padding (`F.pad`, bf16)",
            "Wan2.2's and Qwen-Image's VAE tensors, a UNet's feature map, an audio batch. Neither ggml-metal nor MLX "
            "has a pad kernel of its own to compare with (MLX pads by a copy into a filled array); torch CUDA's "
            "kernel is the peer. GB/s counts the input read once and the output written once.",
            [("ours", "ours"), ("torch", "torch CUDA")], ("÷ torch", ["torch"])),
    "upsample": ("Interpolation (`F.interpolate`, bf16)",
                 "The 2x nearest-exact of the VAE decoders, a UNet's nearest, bilinear, bicubic and trilinear "
                 "(align_corners=False); GB/s counts the input read once and the output written once.",
                 [("ours", "ours"), ("torch", "torch CUDA")], ("÷ torch", ["torch"])),
    "dropout": ("Dropout (bf16)",
                "F.dropout's `native_dropout` (the input read, the output and a bool mask written) and its "
                "backward (the gradient and the mask read, the gradient written). Ours and torch's draw different "
                "masks: each is checked on its own mask and for a plausible share kept.",
                [("ours", "ours"), ("torch", "torch CUDA")], ("÷ torch", ["torch"])),
    "attention": ("Attention (`F.scaled_dot_product_attention`, bf16)",
                  "Decode (1 or 4 query rows over a KV cache, no mask, GQA where the KV heads are fewer) and causal "
                  "prefill; gpt-oss with its sinks. Llama-3-8B, Qwen3-8B and Mistral-7B attend alike (32 query heads "
                  "over 8 KV heads of 128) and share their rows. GB/s counts q, k, v and the output once (ggml: f32 "
                  "queries and output). Each implementation runs its own host's routing: MLX as on an Ultra-class "
                  "GPU (1 pass below 1024 keys, else 2 passes with its block counts), ggml's vec kernel with the "
                  "workgroups and SIMD groups its host sets for bf16; torch 2.15's own kernels as its "
                  "_scaled_dot_product_attention_math_mps routes them (one threadgroup per query head; prefill "
                  "as on macOS before 26.2, without Metal Performance Primitives).",
                  [("ours", "ours"), *PEERS, TORCH_MPS, ("torch", "torch CUDA")], ("÷ best peer", METAL_PEERS)),
}


def _first(rec) -> float | None:
    """The implementation's time in pass 1, if it was correct in every pass and timed."""
    return rec["us"][0] if rec and rec.get("ok") and rec["us"] and rec["us"][0] else None


def cell(rec, copy_gbs: float) -> str:
    """`µs (% copy)` of pass 1, or why there is none."""
    if rec is None or "na" in rec:
        return "n/a"
    if "error" in rec:
        return "error"
    if not rec["ok"]:
        return f"wrong (rel err {max(rec['rel_err']):.1e})"
    us = rec["us"][0]
    return f"{us:.1f} ({100 * rec['bytes'] / (us * 1e3) / copy_gbs:.0f}%)"


def ratio(impls: dict, over: list[str], titles: dict) -> str:
    """Our time over the fastest correct one of `over`, naming it when there are several: `0.93 (MLX)`."""
    ours = _first(impls.get("ours"))
    times = {name: _first(impls.get(name)) for name in over}
    times = {name: t for name, t in times.items() if t}
    if not ours or not times:
        return "n/a"
    best = min(times, key=times.get)
    return f"{ours / times[best]:.2f}" + (f" ({titles[best]})" if len(over) > 1 else "")


def shown(columns: list[tuple], rows: list[dict]) -> list[tuple]:
    """The table's columns, torch-mps's only where some row has a cell for it (a peers.json from before the column
    has none)."""
    has = any(TORCH_MPS[0] in r["impls"] for r in rows)
    return [c for c in columns if c != TORCH_MPS or has]


def table(rows: list[dict], family: str, copy_gbs: float) -> list[str]:
    """One family's heading, note and table, as lines."""
    heading, text, columns, (ratio_title, over) = TABLES[family]
    columns = shown(columns, rows)
    titles = dict(columns)
    lines = [f"### {heading}", ""] + ([text, ""] if text else [])
    head = ["case", *(f"{t} µs (% copy)" for _, t in columns), ratio_title, f"{titles['ours']}, pass 2"]
    lines += ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in rows:
        impls = r["impls"]
        second = impls.get("ours", {}).get("us", [None, None])
        second = f"{second[1]:.1f}" if len(second) > 1 and second[1] else "n/a"
        lines.append("| " + " | ".join([r["name"], *(cell(impls.get(name), copy_gbs) for name, _ in columns),
                                         ratio(impls, over, titles), second]) + " |")
    lines.append("")
    return lines + not_applicable(rows, titles)


def not_applicable(rows: list[dict], titles: dict) -> list[str]:
    """The implementations a table shows as n/a and why, each reason once with the cases it covers."""
    why: dict[tuple, list[str]] = {}
    for r in rows:
        for name, rec in r["impls"].items():
            if "na" in rec:
                why.setdefault((titles.get(name, name), rec["na"]), []).append(r["name"])
    if not why:
        return []
    return ["Not applicable:", ""] + [f"- {title}: {reason} ({', '.join(cases)})"
                                      for (title, reason), cases in why.items()] + [""]


def spread(rows: list[dict], names=("ours",)) -> tuple[float, float] | None:
    """Median and largest relative difference between passes 1 and 2 of the times of the implementations
    `names` (ours; or the peers', to set ours beside)."""
    diffs = [abs(rec["us"][1] / rec["us"][0] - 1) for r in rows for name, rec in r["impls"].items()
             if name in names and _first(rec) and len(rec["us"]) > 1 and rec["us"][1]]
    return (statistics.median(diffs), max(diffs)) if diffs else None


def render(result: dict) -> str:
    """Markdown: a line on the run, then one table per family that the run holds."""
    info, rows = result["info"], result["cases"]
    between, peers = spread(rows), spread(rows, ("ggml", "mlx"))
    lines = [f"Run: {info['device']} ({info['sms']} SMs; {clocks_text(info)}), torch {info['torch']} (CUDA {info['cuda']}), at "
             f"{info.get('commit') or 'an uncommitted tree'}; copy bandwidth {info['copy_gbs']:.0f} GB/s (read + "
             f"write); {info.get('seconds', '?')} s. Cells: median µs per call in pass 1 (% of copy bandwidth)."
             + (f" Our times differ between the passes by {100 * between[0]:.1f}% at the median, "
                f"{100 * between[1]:.1f}% at most" if between else "")
             + (f"; ggml's and MLX's by {100 * peers[0]:.1f}% and {100 * peers[1]:.1f}%" if between and peers else "")
             + ("." if between else ""), ""]
    for family in TABLES:
        mine = [r for r in rows if r["family"] == family]
        if mine:
            lines += table(mine, family, info["copy_gbs"])
    failed = [f"{r['family']} {r['name']}: {r['error']}" for r in rows if "error" in r]
    failed += [f"{r['family']} {r['name']} / {n}: {rec['error']}" for r in rows for n, rec in r["impls"].items()
               if "error" in rec]
    if failed:
        lines += ["Errors:", "", *(f"- {f}" for f in failed), ""]
    return "\n".join(lines)


def main():
    import argparse
    import json
    from pathlib import Path

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", type=Path)
    ap.add_argument("-o", "--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.write_text(render(json.loads(args.json.read_text())))


if __name__ == "__main__":
    main()
