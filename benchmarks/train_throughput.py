"""Training throughput of the tiny LM at the size of the book's CPU studies: optimiser steps per second.

The studies train :class:`posenc.lab.lm.TinyLM` (width 64, 2 layers, 4 heads, windows of 128 bytes,
batches of 16) with :func:`posenc.lab.train.train`, one process per core and one thread each. This
script times ``train`` for several position methods in the variants a study could use:

* ``foreach``: AdamW's default multi-tensor implementation (the stored studies so far);
* ``fused``: ``TrainConfig(fused=True)``, AdamW's fused kernel;
* ``fused + compiled``: the same with the model under ``torch.compile`` (its input checks break the
  graph into a few pieces; the compile time is excluded, reported apart).

Variants are timed in turns (a, b, c, a, b, c, ...) so that the slow phases of a shared machine
fall on all of them; the median over repeats is reported, with the range. Each variant trains a
fresh model with the same seed; the first steps (``--warmup``) are not timed.

Usage: OMP_NUM_THREADS=1 python benchmarks/train_throughput.py [--methods rope t5 ...] [--steps 100]
[--repeats 3] [--threads 1] [--json benchmarks/results/train_throughput_cpu.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

from posenc.lab import LMConfig, TinyLM
from posenc.lab.data import load_stdlib_corpus
from posenc.lab.experiments.records import cpu_name
from posenc.lab.train import TrainConfig, train

VARIANTS = ("foreach", "fused", "fused + compiled")


def steps_per_second(method: str, variant: str, steps: int, warmup: int, corpus) -> tuple[float, float]:
    """Steps/s of ``steps`` timed steps after ``warmup`` untimed ones, and the warm-up's seconds."""
    model = TinyLM(LMConfig(d_model=64, n_layer=2, n_head=4, max_len=128), method)
    fused = variant != "foreach"
    net = torch.compile(model) if "compiled" in variant else model
    cfg = TrainConfig(steps=warmup + steps, batch_size=16, seq_len=128, warmup_steps=min(30, warmup + steps),
                      progress=False, fused=fused)
    # the warm-up is a separate call on the same model (compiling happens there); then the timed call
    start = time.perf_counter()
    train(net, corpus.train, TrainConfig(steps=warmup, batch_size=16, seq_len=128, warmup_steps=1, progress=False,
                                         fused=fused))
    warm = time.perf_counter() - start
    result = train(net, corpus.train, cfg)
    return cfg.steps / result.seconds, warm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", nargs="+", default=["nope", "learned", "rope", "alibi", "t5", "deberta"])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    corpus = load_stdlib_corpus()
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip() or None
    except OSError:
        commit = None
    started = time.perf_counter()
    rows = []
    print(f"torch {torch.__version__}, {cpu_name()}, {args.threads} thread(s), "
          f"commit {commit}\n")
    print("| method | " + " | ".join(f"{v} (steps/s)" for v in args.variants) + " | best / foreach |")
    print("| --- | " + " | ".join("---" for _ in args.variants) + " | --- |")
    for method in args.methods:
        times: dict[str, list[float]] = {v: [] for v in args.variants}
        warm: dict[str, list[float]] = {v: [] for v in args.variants}
        for _ in range(args.repeats):
            for variant in args.variants:
                sps, w = steps_per_second(method, variant, args.steps, args.warmup, corpus)
                times[variant].append(sps)
                warm[variant].append(w)
        med = {v: statistics.median(t) for v, t in times.items()}
        for v in args.variants:
            rows.append(dict(method=method, variant=v, steps_per_s=med[v], min=min(times[v]), max=max(times[v]),
                             runs=times[v], warmup_s=statistics.median(warm[v])))
        best = max(med.values()) / med["foreach"] if "foreach" in med else float("nan")
        print(f"| {method} | " + " | ".join(f"{med[v]:.1f} ({min(times[v]):.1f}–{max(times[v]):.1f})" for v in args.variants)
              + f" | {best:.2f}× |", flush=True)
    if args.json:
        meta = dict(command=" ".join(["python", *sys.argv]), commit=commit, torch=torch.__version__,
                    cpu=cpu_name(), threads=args.threads, steps=args.steps,
                    warmup=args.warmup, repeats=args.repeats, wall_s=round(time.perf_counter() - started, 1),
                    model="TinyLM d_model=64 n_layer=2 n_head=4, batch 16 x 128 bytes")
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
