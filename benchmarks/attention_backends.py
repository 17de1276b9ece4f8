"""Forward time of posenc.attention.attention: explicit reference vs fused SDPA backend.

Usage: python benchmarks/attention_backends.py [--device cuda] [--dtype float32]
Prints a Markdown table (milliseconds per call, median of repeats).
"""

import argparse
import statistics

import torch

from posenc.attention import attention
from posenc.lab.notebook import time_ms


def bench_in_turns(fns: dict, repeats: int) -> dict:
    """Median milliseconds per call of each function, timed in turns (a, b, c, a, b, c, ...), so
    that the slow and fast phases of a noisy machine fall on all of them alike and their ratios
    hold better than those of functions timed one after the other (3 warm-up calls each)."""
    for fn in fns.values():
        time_ms(fn, repeats=1, warmup=2)
    times: dict = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            times[name].append(time_ms(fn, repeats=1, warmup=0))
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    print(f"device={device} dtype={dtype} torch={torch.__version__} threads={torch.get_num_threads()}\n")
    print("| B | H | T | D | causal | bias | reference (ms) | sdpa (ms) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for B, H, T, D in [(8, 4, 128, 16), (4, 8, 512, 64), (1, 8, 2048, 64)]:
        q, k, v = (torch.randn(B, H, T, D, device=device, dtype=dtype) for _ in range(3))
        bias = torch.randn(1, H, T, T, device=device, dtype=dtype)
        for causal, b in [(True, None), (True, bias)]:
            ms = {
                backend: time_ms(lambda: attention(q, k, v, bias=b, causal=causal, backend=backend), args.repeats, warmup=3)
                for backend in ("reference", "sdpa")
            }
            print(f"| {B} | {H} | {T} | {D} | {causal} | {b is not None} | {ms['reference']:.2f} | {ms['sdpa']:.2f} |")


if __name__ == "__main__":
    main()
