"""Time of applying RoPE to one query (or key) tensor, against the common eager formulation and a copy.

For both layouts, float32 and bfloat16, a prefill shape ``(1, 32, 2048, 128)`` and a decode shape
``(1, 32, 1, 128)`` whose cos/sin row is read from a 32768-position cache (position 32767), compares:

* ``copy``: ``x.clone()``, the physical floor (RoPE reads ``x`` once and writes a new tensor once);
* ``copy into existing``: ``out.copy_(x)``, the same traffic without allocating the result (on the
  CPU a fresh 32 MiB result costs page faults that a real model also pays, so ``copy`` is the fair
  floor for functions that return a new tensor);
* ``hf eager``: ``x * cos_full + rotate_half(x) * sin_full``, the Hugging Face style, with
  full-width cos/sin cast to ``x``'s dtype (for ``interleaved``, the GPT-J style pair swap);
* ``posenc eager``: :func:`posenc.rope.apply_rope` with ``backend="eager"``;
* ``posenc compiled``: ``backend="compiled"`` (``torch.compile`` of the same function);
* ``posenc auto``: the default, compiled from ``COMPILE_MIN_NUMEL`` elements on, eager below.

Reports the median wall time per call (what a Python caller waits, launch overheads included), the
effective bandwidth (bytes of ``x`` read + written over that time), the ratio to the copy, the
speed-up over ``hf eager``, and the largest difference between the compiled and eager outputs. On
CUDA it also reports the GPU kernel time per call (from ``torch.profiler``) and the bandwidth the
kernels reach, as a percentage of the copy kernel's: at these sizes a call's wall time is mostly
the CPU's launch overhead, which the GPU's own time does not include.

Usage: python benchmarks/rope.py [--device cuda] [--repeats 30] [--json results/rope_cpu.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from attention_backends import bench  # noqa: E402

from posenc.rope import RotaryEmbedding, apply_rope  # noqa: E402


def rotate_half_hf(x: torch.Tensor) -> torch.Tensor:
    """Hugging Face's ``rotate_half`` (half layout): ``cat(-x2, x1)``."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rotate_every_two(x: torch.Tensor) -> torch.Tensor:
    """GPT-J's pair swap (interleaved layout): ``(x0, x1) -> (-x1, x0)``."""
    return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)


def hf_eager(x, cos_full, sin_full, layout):
    rot = rotate_half_hf(x) if layout == "half" else rotate_every_two(x)
    return x * cos_full + rot * sin_full


def kernel_ms(fn, repeats: int) -> float:
    """GPU time of the kernels ``fn`` launches, per call (ms), from the profiler's device events."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(repeats):
            fn()
        torch.cuda.synchronize()
    total_us = sum(e.device_time_total for e in prof.key_averages() if e.device_type.name == "CUDA")
    return total_us / repeats / 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"device={name} torch={torch.__version__}\n")
    rope = RotaryEmbedding(128, 32768).to(device)
    rows = []
    cuda_cols = (" kernel µs | kernel bandwidth, % of copy |", " --- | --- |") if device.type == "cuda" else ("", "")
    print("| shape | dtype | layout | impl | ms | GB/s | × copy | speed-up vs hf |" + cuda_cols[0])
    print("| --- | --- | --- | --- | --- | --- | --- | --- |" + cuda_cols[1])
    for shape, start in [((1, 32, 2048, 128), 0), ((1, 32, 1, 128), 32767)]:
        T = shape[2]
        cos, sin = rope.cos_sin(torch.arange(start, start + T, device=device))  # (T, 64) fp32
        for dtype in (torch.float32, torch.bfloat16):
            x = torch.randn(shape, device=device).to(dtype)
            reps = args.repeats if T > 1 else 10 * args.repeats
            for layout in ("half", "interleaved"):
                full = (torch.cat([cos, cos], -1), torch.cat([sin, sin], -1)) if layout == "half" else (
                    cos.repeat_interleave(2, -1), sin.repeat_interleave(2, -1))
                cf, sf = full[0].to(dtype), full[1].to(dtype)
                out = torch.empty_like(x)
                impls = {
                    "copy": lambda: x.clone(),
                    "copy into existing": lambda: out.copy_(x),
                    "hf eager": lambda: hf_eager(x, cf, sf, layout),
                    "posenc eager": lambda: apply_rope(x, cos, sin, layout, backend="eager"),
                    "posenc compiled": lambda: apply_rope(x, cos, sin, layout, backend="compiled"),
                    "posenc auto": lambda: apply_rope(x, cos, sin, layout),
                }
                eager_out = impls["posenc eager"]()
                diff = (impls["posenc compiled"]().float() - eager_out.float()).abs().max().item()
                hf_diff = (impls["hf eager"]().float() - eager_out.float()).abs().max().item()
                ms = {k: bench(f, reps, device) for k, f in impls.items()}
                kms = {k: kernel_ms(f, reps) for k, f in impls.items()} if device.type == "cuda" else {}
                nbytes = 2 * x.numel() * x.element_size()
                for impl, t in ms.items():
                    row = dict(
                        shape=list(shape), dtype=str(dtype).replace("torch.", ""), layout=layout, impl=impl, ms=t,
                        gbps=nbytes / t / 1e6, x_copy=t / ms["copy"], speedup_vs_hf=ms["hf eager"] / t,
                        max_diff_compiled_vs_eager=diff, max_diff_hf_vs_eager=hf_diff, device=name,
                    )
                    if kms:
                        row.update(kernel_ms=kms[impl], kernel_gbps=nbytes / kms[impl] / 1e6,
                                   kernel_pct_of_copy_bw=100 * kms["copy"] / kms[impl])
                    rows.append(row)
                    extra = f" {row['kernel_ms'] * 1e3:.1f} | {row['kernel_pct_of_copy_bw']:.0f}% |" if kms else ""
                    print(
                        f"| {tuple(shape)} | {row['dtype']} | {layout} | {impl} | {t:.4f} | {row['gbps']:.1f} | "
                        f"{row['x_copy']:.2f} | {row['speedup_vs_hf']:.2f} |{extra}"
                    )
                print(f"<!-- compiled vs eager max |diff| {diff:.3g}; hf vs eager {hf_diff:.3g} -->")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
