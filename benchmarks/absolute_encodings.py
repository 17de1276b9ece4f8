"""Cost of adding an absolute position code: sinusoidal (computed per call, or looked up), learned, low-rank, hybrid.

Times ``method.transform_input(x, positions)`` for ``x`` of shape (B, T, C), the whole cost an
absolute encoding adds to a forward pass, and reports each method's parameters. The sinusoidal
code is computed in float64 from the positions on every call (``SinusoidalPE``); "sin table" is
the alternative a library could cache, a lookup into a precomputed float32 table.

Usage: python benchmarks/absolute_encodings.py [--device cuda] [--dtype float32]
Prints a Markdown table (microseconds per call, median of repeats).
"""

import argparse

import torch

from posenc.absolute import HybridPE, LearnedPE, LowRankPE, SinusoidalPE, sinusoidal_table
from posenc.lab.notebook import time_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    print(f"device={device} dtype={dtype} torch={torch.__version__} threads={torch.get_num_threads()}\n")
    names = ["sinusoidal", "sin table", "learned", "low-rank r=64", "hybrid"]
    print("| B | T | C | " + " | ".join(f"{n} (µs)" for n in names) + " | params: learned / low-rank |")
    print("| --- | --- | --- | " + " | ".join("---" for _ in names) + " | --- |")
    for B, T, C in [(8, 128, 64), (8, 1024, 512), (1, 4096, 512), (1, 8192, 1024)]:
        x = torch.randn(B, T, C, device=device, dtype=dtype)
        positions = torch.arange(T, device=device)
        table = sinusoidal_table(T, C, device=device, dtype=dtype)
        methods = {
            "sinusoidal": SinusoidalPE(C).to(device),
            "learned": LearnedPE(T, C).to(device),
            "low-rank r=64": LowRankPE(T, C, rank=64).to(device),
            "hybrid": HybridPE(T, C).to(device),
        }
        us = {}
        with torch.no_grad():
            for name in names:
                if name == "sin table":
                    fn = lambda: x + table[positions]  # noqa: E731
                else:
                    fn = lambda m=methods[name]: m.transform_input(x, positions)  # noqa: E731
                us[name] = 1e3 * time_ms(fn, args.repeats, warmup=3)
        params = [sum(p.numel() for p in methods[n].parameters()) for n in ("learned", "low-rank r=64")]
        print(f"| {B} | {T} | {C} | " + " | ".join(f"{us[n]:.0f}" for n in names) + f" | {params[0]:,} / {params[1]:,} |")


if __name__ == "__main__":
    main()
