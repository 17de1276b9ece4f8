"""Training throughput of the extrapolation study's cells with P processes sharing one device.

The study (:mod:`posenc.lab.experiments.extrapolation`) trains many tiny models, one per cell; at the
``--preset gpu`` size one model leaves much of a GPU idle. This script measures how much running P
cells at once on the device buys: for each P of ``--processes`` it starts P fresh processes
(``multiprocessing``, spawn), process ``i`` on :func:`posenc.lab.experiments.distributed.device_for`
``(i, device, GPUs)`` (on one GPU all of them on ``cuda:0``, as under ``torchrun``) with
``max(1, cores // P)`` CPU threads. Each builds its own model of the study
(:func:`posenc.lab.experiments.extrapolation.build_model`: :class:`posenc.lab.lm.TinyLM` at the preset's
width, depth, heads and cache length, seed ``i``), of the ``(method, task)`` cell
``cells[i % len(cells)]`` (every method of ``--methods`` on every task of ``--tasks``), and trains it
with the study's loop (:func:`posenc.lab.train.train` on the byte corpus, or :func:`posenc.lab.train.train_task`
on passkey rows) at the preset's training shape: ``lm_batch`` (or ``passkey_batch``) rows of
``train_length`` tokens, the preset's learning rate.

Timing: ``--untimed-steps`` steps (a warm-up), then all P processes wait for each other (a barrier) and
train for ``--seconds`` of wall time (or ``--steps`` steps each), in calls of ``--chunk`` steps
(each call a fresh optimiser, which costs nothing measurable at these sizes); each process counts
its steps and its own elapsed time, the device synchronised at both ends. Reported per P:

* total steps/s = the sum over processes of steps / elapsed, and per-process steps/s (mean, min-max);
* the peak GPU memory of each process (``max_memory_allocated`` / ``max_memory_reserved``), and the
  device memory in use while all P processes hold theirs (``mem_get_info``, CUDA contexts included);
* cells per device-minute = 60 x sum over processes of (steps/s of the process) / (steps per cell of
  its cell), where steps per cell = the task's steps (``lm_steps`` or ``passkey_steps``) + for a
  RoPE model ``len(finetune_scalings) x finetune_steps``. With one cell kind this is
  (total steps/s x 60) / steps per cell. It counts training steps at the training shape only: the
  evaluations and the fine-tunes' longer windows (same tokens per step, longer attention) are not
  in it, so it is an upper bound on the study's rate, and the ratio between two P is what it measures.

``torch.compile`` is not measured: :mod:`posenc.lab.train` has no option to compile the model.

Usage::

    python benchmarks/study_throughput.py --device cuda --processes 1 4 8 12 --seconds 30 --json out.json
    # a test on the CPU with a tiny model (every field of ExtrapolationStudy is an option)
    python benchmarks/study_throughput.py --device cpu --processes 1 2 --steps 5 --preset cpu --d-model 16 \\
        --n-layer 1 --n-head 2 --train-length 64 --lm-batch 4

Prints a Markdown table; ``--json`` also writes the rows with the provenance (command, commit from
``POSENC_COMMIT`` or git, torch version, device name, CPU count).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing as mp
import os
import platform
import queue
import resource
import shlex
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch

from posenc.lab.experiments.distributed import device_for
from posenc.lab.experiments.extrapolation_config import PRESETS, ExtrapolationStudy
from posenc.lab.experiments.options import add_options, from_args
from posenc.lab.experiments.records import cpu_name

ROOT = Path(__file__).resolve().parents[1]
FORMULA = ("cells per device-minute = 60 * sum over processes of steps_per_s / steps_per_cell; steps_per_cell = "
           "lm_steps or passkey_steps (the cell's task) + len(finetune_scalings) * finetune_steps for RoPE; "
           "training steps at the training shape only (evaluations and the longer fine-tune windows excluded)")


def steps_per_cell(study: ExtrapolationStudy, method: str, task: str) -> int:
    """Optimiser steps of one cell: its task's training steps, plus the fine-tunes of a RoPE model."""
    from posenc.lab.experiments.extrapolation import build_position
    from posenc.rope import RotaryEmbedding

    steps = study.lm_steps if task == "lm" else study.passkey_steps
    if isinstance(build_position(study, method, 0), RotaryEmbedding) and study.finetune_steps > 0:
        steps += len(study.finetune_scalings) * study.finetune_steps
    return steps


def worker(index: int, P: int, args: dict, barrier, results) -> None:
    """One process: build its cell's model, warm up, wait for the others, train for the budget, report."""
    try:
        torch.set_num_threads(max(1, args["cores"] // P))
        from posenc.lab.data import load_stdlib_corpus, passkey_retrieval
        from posenc.lab.experiments.extrapolation import build_model
        from posenc.lab.train import TrainConfig, train, train_task

        study: ExtrapolationStudy = args["study"]
        method, task = args["cells"][index % len(args["cells"])]
        kind = torch.device(args["device"]).type
        device = device_for(index, args["device"], torch.cuda.device_count() if kind == "cuda" else 0)
        cuda = kind == "cuda"
        if cuda:
            torch.cuda.set_device(torch.device(device))
        model = build_model(study, method, index, device)
        L = study.train_length
        batch = study.lm_batch if task == "lm" else study.passkey_batch
        data = load_stdlib_corpus().train if task == "lm" else None

        def sampler(b, g):  # the study's passkey rows: inputs of L tokens
            return passkey_retrieval(b, L + 1, g, num_digits=study.passkey_digits)

        calls = [0]

        def run(steps: int) -> float:
            calls[0] += 1
            cfg = TrainConfig(steps=steps, batch_size=batch, seq_len=L, lr=study.lr, warmup_steps=0,
                              seed=1000 * index + calls[0], progress=False)
            result = train(model, data, cfg) if task == "lm" else train_task(model, sampler, cfg)
            return result.losses[-1]

        def sync() -> None:
            if cuda:
                torch.cuda.synchronize()

        if args["untimed_steps"]:
            run(args["untimed_steps"])
        sync()
        barrier.wait(timeout=args["barrier_timeout"])
        steps, start = 0, time.perf_counter()
        while True:
            if args["steps"] is not None:
                if steps >= args["steps"]:
                    break
                n = min(args["chunk"], args["steps"] - steps)
            else:
                if time.perf_counter() - start >= args["seconds"]:
                    break
                n = args["chunk"]
            loss = run(n)
            steps += n
        sync()
        elapsed = time.perf_counter() - start
        out = {"index": index, "method": method, "task": task, "device": device, "steps": steps,
               "seconds": elapsed, "steps_per_s": steps / elapsed, "last_loss": loss,
               "threads": torch.get_num_threads(), "steps_per_cell": steps_per_cell(study, method, task),
               "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}  # Linux: KiB
        if cuda:
            free, total = torch.cuda.mem_get_info()
            out.update(device_name=torch.cuda.get_device_name(), peak_allocated=torch.cuda.max_memory_allocated(),
                       peak_reserved=torch.cuda.max_memory_reserved(), device_used=total - free, device_total=total)
            barrier.wait(timeout=args["barrier_timeout"])  # keep this memory until every process has read the device's
        results.put(out)
    except BaseException as err:  # report the failure (e.g. out of memory) instead of hanging the others
        barrier.abort()
        results.put({"index": index, "error": f"{type(err).__name__}: {err}".splitlines()[0][:300],
                     "traceback": traceback.format_exc()[-2000:]})


def measure(P: int, args: dict) -> dict:
    """Start ``P`` workers, gather what each reports, and sum it into one row."""
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(P), ctx.Queue()
    procs = [ctx.Process(target=worker, args=(i, P, args, barrier, results), daemon=True) for i in range(P)]
    start = time.perf_counter()
    for p in procs:
        p.start()
    got, deadline = [], time.monotonic() + args["barrier_timeout"] + 2 * (args["seconds"] or 0) + 120
    while len(got) < P and time.monotonic() < deadline:
        try:
            got.append(results.get(timeout=5))
        except queue.Empty:  # check that somebody is still alive
            if not any(p.is_alive() for p in procs) and results.empty():
                break
    for p in procs:
        p.join(timeout=30)
        if p.is_alive():
            p.kill()
    errors = [g for g in got if "error" in g]
    row = {"processes": P, "threads_per_process": max(1, args["cores"] // P),
           "wall_s": round(time.perf_counter() - start, 1)}
    if errors or len(got) < P:
        first = errors[0] if errors else {"error": f"{P - len(got)} of {P} processes reported nothing",
                                          "traceback": ""}
        return dict(row, error=first["error"], traceback=first["traceback"])
    got.sort(key=lambda g: g["index"])
    rates = [g["steps_per_s"] for g in got]
    row.update(total_steps_per_s=sum(rates), per_process_steps_per_s_mean=statistics.mean(rates),
               per_process_steps_per_s_min=min(rates), per_process_steps_per_s_max=max(rates),
               cells_per_device_minute=60 * sum(g["steps_per_s"] / g["steps_per_cell"] for g in got),
               processes_detail=got)
    row["peak_rss_per_process_max"] = max(g["peak_rss"] for g in got)
    if "peak_allocated" in got[0]:
        row.update(peak_allocated_per_process_max=max(g["peak_allocated"] for g in got),
                   peak_reserved_per_process_max=max(g["peak_reserved"] for g in got),
                   device_used=max(g["device_used"] for g in got), device_total=got[0]["device_total"],
                   device_name=got[0]["device_name"])
    return row


def commit() -> tuple[str, bool | None]:
    """The commit (``POSENC_COMMIT``, else git's HEAD) and whether ``code/`` is dirty (``None``: unknown)."""
    def git(*a: str) -> str | None:
        try:
            done = subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True, timeout=10)
            return done.stdout.strip() if done.returncode == 0 else None
        except (OSError, subprocess.SubprocessError):
            return None

    head = os.environ.get("POSENC_COMMIT") or git("rev-parse", "HEAD") or ""
    status = git("status", "--porcelain", "--", "code")
    return head, None if status is None else bool(status)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", choices=sorted(PRESETS), default="gpu", help="the study configuration measured")
    p.add_argument("--device", default="cuda", help="cpu or cuda (process i on cuda:(i %% GPUs))")
    p.add_argument("--processes", type=int, nargs="+", default=[1, 4, 8, 12], help="values of P, in turn")
    p.add_argument("--seconds", type=float, default=30.0, help="timed wall time per P (after the warm-up)")
    p.add_argument("--steps", type=int, help="time this many steps per process instead of --seconds")
    p.add_argument("--untimed-steps", type=int, default=10, help="untimed steps before the barrier")
    p.add_argument("--chunk", type=int, default=10, help="steps per call of posenc.lab.train (the budget's granularity)")
    p.add_argument("--cores", type=int, default=os.cpu_count() or 1, help="CPU cores shared by the P processes")
    p.add_argument("--barrier-timeout", type=float, default=600.0, help="seconds to wait for the slowest start")
    p.add_argument("--json", help="also write the rows and the provenance to this file")
    add_options(p.add_argument_group("study (fields of ExtrapolationStudy; default: the preset's; "
                                     "--methods default rope, --tasks default lm)"), ExtrapolationStudy)
    args = p.parse_args()
    if args.methods is None:
        args.methods = ["rope"]
    if args.tasks is None:
        args.tasks = ["lm"]
    try:
        study = from_args(PRESETS[args.preset], args)
        study.method_names  # noqa: B018  (raises for a name that is not registered)
    except ValueError as err:
        p.error(str(err))
    for name in ("processes", "chunk", "cores"):
        values = getattr(args, name)
        if any(v < 1 for v in (values if isinstance(values, list) else [values])):
            p.error(f"--{name} must be >= 1, got {values}")
    if args.steps is not None and args.steps < 1 or args.untimed_steps < 0 or args.seconds <= 0:
        p.error("--steps must be >= 1, --untimed-steps >= 0 and --seconds > 0")
    cells = [(m, t) for t in study.tasks for m in study.method_names]
    config = {"study": study, "cells": cells, "device": args.device, "seconds": None if args.steps else args.seconds,
              "steps": args.steps, "untimed_steps": args.untimed_steps, "chunk": args.chunk, "cores": args.cores,
              "barrier_timeout": args.barrier_timeout}
    head, dirty = commit()
    command = shlex.join([os.path.basename(sys.executable), *sys.argv])
    budget = f"{args.steps} steps" if args.steps else f"{args.seconds:g} s"
    print(f"{command}\ncommit {head or '?'}{' (code/ dirty)' if dirty else ''}, torch {torch.__version__}, "
          f"{os.cpu_count()} CPUs ({args.cores} shared), device {args.device}")
    print(f"preset {args.preset}: d_model {study.d_model}, {study.n_layer} layers, {study.n_head} heads, "
          f"L {study.train_length}, batch {study.lm_batch} (lm) / {study.passkey_batch} (passkey); cells {cells}; "
          f"{args.untimed_steps} warm-up steps, then {budget} per P")
    print(FORMULA + "\n", flush=True)
    start, rows = time.perf_counter(), []
    header = ("| P | threads/proc | total steps/s | per-process steps/s (min-max) | x P=1 | peak memory/proc (GiB) "
              "| device used (GiB) | cells/device-min |")
    lines = [header, "| " + " | ".join(["---"] * 8) + " |"]
    for P in args.processes:
        row = measure(P, config)
        rows.append(row)
        if "error" in row:
            lines.append(f"| {P} | {row['threads_per_process']} | failed: {row['error']} | | | | | |")
            print(f"P={P} failed: {row['error']}\n{row['traceback']}", file=sys.stderr, flush=True)
            continue
        base = next((r for r in rows if r["processes"] == 1 and "error" not in r), None)
        ratio = f"{row['total_steps_per_s'] / base['total_steps_per_s']:.2f}" if base else ""
        peak = "peak_allocated_per_process_max" if "device_used" in row else "peak_rss_per_process_max"
        gib = lambda key: f"{row[key] / 2**30:.2f}" if key in row else ""  # noqa: E731
        lines.append(f"| {P} | {row['threads_per_process']} | {row['total_steps_per_s']:.2f} | "
                     f"{row['per_process_steps_per_s_mean']:.2f} ({row['per_process_steps_per_s_min']:.2f}-"
                     f"{row['per_process_steps_per_s_max']:.2f}) | {ratio} | {gib(peak)} | "
                     f"{gib('device_used')} | {row['cells_per_device_minute']:.3f} |")
        print(f"P={P}: {row['total_steps_per_s']:.2f} steps/s in all ({row['wall_s']} s)", flush=True)
    print("\n" + "\n".join(lines))
    if args.json:
        device_name = next((r["device_name"] for r in rows if "device_name" in r), None)
        out = {"provenance": {"command": command, "commit": head, "dirty": dirty, "torch": torch.__version__,
                              "python": platform.python_version(), "device": args.device,
                              "device_name": device_name or cpu_name(),
                              "cpu_count": os.cpu_count(), "cores_shared": args.cores,
                              "wall_s": round(time.perf_counter() - start, 1)},
               "preset": args.preset, "study": dataclasses.asdict(study),
               "cells": cells, "budget": {"seconds": config["seconds"], "steps": args.steps,
                                          "untimed_steps": args.untimed_steps, "chunk": args.chunk},
               "formula": FORMULA, "compile": "not measured: posenc.lab.train has no option to compile the model",
               "table": "\n".join(lines), "rows": rows}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
