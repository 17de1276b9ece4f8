"""Forward time of posenc.attention.attention: explicit reference vs fused SDPA backend.

Usage: python benchmarks/attention_backends.py [--device cuda] [--dtype float32]
Prints a Markdown table (milliseconds per call, median of repeats).
"""

import argparse
import statistics
import time

import torch

from posenc.attention import attention


def _seconds(fn, device: torch.device) -> float:
    """Wall time of one call of ``fn``, the GPU's queued work included."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def bench(fn, repeats: int, device: torch.device) -> float:
    """Median milliseconds per call of ``fn`` over ``repeats`` calls, after 3 warm-up calls."""
    for _ in range(3):
        fn()
    return 1e3 * statistics.median(_seconds(fn, device) for _ in range(repeats))


def bench_in_turns(fns: dict, repeats: int, device: torch.device) -> dict:
    """Median milliseconds per call of each function, timed in turns (a, b, c, a, b, c, ...), so
    that the slow and fast phases of a noisy machine fall on all of them alike and their ratios
    hold better than those of functions timed one after the other."""
    for fn in fns.values():
        for _ in range(3):
            fn()
    times: dict = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            times[name].append(_seconds(fn, device))
    return {name: 1e3 * statistics.median(t) for name, t in times.items()}


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
                backend: bench(lambda: attention(q, k, v, bias=b, causal=causal, backend=backend), args.repeats, device)
                for backend in ("reference", "sdpa")
            }
            print(f"| {B} | {H} | {T} | {D} | {causal} | {b is not None} | {ms['reference']:.2f} | {ms['sdpa']:.2f} |")


if __name__ == "__main__":
    main()
