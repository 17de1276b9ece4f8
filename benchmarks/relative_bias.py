"""Peak memory and time of causal attention with a relative bias (T5, ALiBi or KERPLE), on every attention backend.

Compares, at T = S in ``--lengths`` (default 1024, 4096, 8192), B = 1, H = 8, D = 64, float32, forward
only by default (``--batch``, ``--heads``, ``--head-dim``, ``--dtype``, ``--backward`` change that):

* ``sdpa, is_causal``: ``torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)``
  called directly, no bias and no mask (on a GPU in half precision, the flash kernel): the floor
  every other row is divided by;
* ``sdpa, no bias``: the same through ``posenc.attention(causal=True, backend="sdpa")`` (checks that
  the wrapper adds nothing to the floor);
* ``sdpa, causal mask``: SDPA given an explicit boolean (T, S) causal mask and no bias (control: the
  cost of leaving the ``is_causal`` path, whatever the bias costs on top of it);
* ``reference``: explicit scores and softmax, with the (B, H, T, S) bias materialised;
* ``sdpa + bias``: fused attention reading a (1, H, T, S) bias built by the caller; the wrapper must
  not overwrite the caller's tensor, so the causal mask goes into a masked copy (two biases' worth);
* ``sdpa + bias_fn``: the same bias given as a function, materialised inside the wrapper, which then
  writes the causal mask into it in place (one bias's worth);
* ``flex``: ``flex_attention`` evaluating the bias inside the kernel (``posenc.attention(...,
  bias_fn=..., backend="flex")``);
* ``flex, no bias``: ``flex_attention`` with the same causal block mask and no ``score_mod``
  (control: separates the cost of the bias from the cost of flex itself);
* ``flash-attn alibi_slopes`` (``--method alibi`` only): the flash-attn package's own ALiBi,
  ``flash_attn_func(q, k, v, causal=True, alibi_slopes=...)`` on (B, T, H, D) inputs, where
  ``import flash_attn`` works; otherwise one row says it is not installed.

The bias comes from :class:`posenc.relative.T5RelativeBias` (decoder setting: 32 buckets, max
distance 128; ``--method t5``, the default), :class:`posenc.alibi.ALiBi` (``--method alibi``), or
:class:`KerpleLogBias` below (``--method kerple``: KERPLE's logarithmic bias
``-r1[h] log(1 + r2[h] |j - i|)``, Chi et al. 2022, arXiv:2205.09921, a relative-position *function*
computed inside the flex kernel rather than read from a table), built inside the timed call as a
model would build it every forward pass. ``--method`` takes several names; the bias-free rows are
then measured once per length. With ``--backward`` every row times forward + backward:
q, k, v require grad, ``out.backward(grad_out)`` with a fixed random ``grad_out``, and the bias
parameters (T5's table, KERPLE's r1 and r2) get gradients as in training (``--no-bias-grad`` freezes
them, to separate the cost of the bias gradient).

Each configuration runs in its own process (``--timeout`` seconds at most; a timeout, an
out-of-memory error or any other failure becomes a row, not the end of the run), so peak memory is
measured cleanly: on CUDA with ``torch.cuda.max_memory_allocated`` above what was allocated before
the call, on the CPU from the process's peak resident set (``VmHWM``, reset through
``/proc/self/clear_refs``, Linux only). Times: one untimed call (it compiles flex), one untimed
call that measures the peak, ``--warmup`` more, then ``--repeats`` timed calls (CUDA events on a
GPU, wall time on the CPU; fewer, but at least 3, where they would take more than ``--time-budget``
seconds); ``ms`` is their median, ``ms_min``/``ms_max`` their range.
``--skip-bias-above T`` skips the backends that materialise a (B, H, T, S) bias above that length
(a row names the size of the bias). ``--jobs N`` first compiles every flex configuration in N
parallel processes (Inductor's on-disk caches then make the timed processes' compiles short).
``--profile`` records the top kernels by device time (``torch.profiler``) of the bias-free SDPA
and the flex rows at the largest length. Outputs (and, with ``--backward``, the gradients) are
compared with the reference backend, or with ``sdpa + bias`` where the reference is skipped; the
bias-free rows are compared with ``sdpa, is_causal``.

Usage: python benchmarks/relative_bias.py [--method t5 alibi kerple] [--device cuda] [--dtype bfloat16]
       [--backward] [--lengths 1024 4096 8192] [--json results/relative_bias_cpu.json]
The defaults (reference skipped above T = 4096, 2 timed repeats) take about five minutes with one CPU thread.
Prints a Markdown table (times and peaks also as ratios to ``sdpa, is_causal``, and the goal
check: flex within 1.2x of the floor's time and 1.05x of its peak at T >= 8192); with ``--json``,
also saves the rows after every length (the chapters on relative methods and on ALiBi show the
saved CPU and GPU results from ``benchmarks/results/``).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Optional

import torch
from torch import Tensor, nn

from posenc.relative.common import RelativeScalarBias

BACKENDS = ("sdpa, is_causal", "sdpa, no bias", "sdpa, causal mask", "reference", "sdpa + bias", "sdpa + bias_fn",
            "flex", "flex, no bias", "flash-attn alibi_slopes")
FLOOR = "sdpa, is_causal"
NO_BIAS = ("sdpa, is_causal", "sdpa, no bias", "sdpa, causal mask", "flex, no bias")  # one row per length, any method
MATERIALISED = ("reference", "sdpa + bias", "sdpa + bias_fn")  # build a (B or 1, H, T, S) bias
FLEX = ("flex", "flex, no bias")
FLASH = "flash-attn alibi_slopes"
PROFILED = (FLOOR, "flex", "flex, no bias", FLASH)
METHODS = ("t5", "alibi", "kerple")
METHOD_NAMES = {"t5": "T5", "alibi": "ALiBi", "kerple": "KERPLE-log"}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
GOAL_MIN_T, GOAL_TIME, GOAL_PEAK = 8192, 1.2, 1.05  # flex against the floor at T >= 8k
RESULT = "RESULT "  # prefix of the line a child process prints its row on
_RUNNING: set = set()  # child processes now running (ended with the parent on SIGTERM or SIGINT)


class KerpleLogBias(RelativeScalarBias):
    """KERPLE's logarithmic bias ``-r1[h] · log(1 + r2[h] · |Δ|)``, ``Δ = key - query`` position, per head.

    Chi, Fan, Ramadge and Rudnicky (2022), "KERPLE: Kernelized Relative Positional Embedding for
    Length Extrapolation", arXiv:2205.09921, the logarithmic variant (KERPLE-log), with ``r1, r2 > 0``
    learned per head. Initialisation and the positivity clamp follow the authors' code
    (chijames/KERPLE, ``ParallelKerpleLog``): ``r1 ~ U(0, 2)``, ``r2 ~ U(0, 1)``, both clamped to
    at least ``1e-2`` in every forward pass. Not a ``posenc`` method (the book does not train it);
    the benchmark uses it as the case of a bias that is a *function* of the relative position,
    computed inside the flex kernel, where T5 and ALiBi read an ``(H, T + S - 1)`` table.

    The materialised bias (:meth:`attention_bias`) comes from the table of the base class
    (``relative_bias`` below, in fp32, cast to ``q.dtype``); the bias function evaluates the formula
    in fp32 on the indices (positions must be contiguous, ``q_positions = q0 + q_idx``).

    Args:
        num_heads: ``H``.

    Parameters: ``r1``, ``r2`` ``(H,)`` float32.
    """

    EPS = 1e-2

    def __init__(self, num_heads: int):
        super().__init__()
        if not isinstance(num_heads, int) or num_heads < 1:
            raise ValueError(f"num_heads must be a positive int, got {num_heads!r}")
        self.num_heads = num_heads
        self.r1 = nn.Parameter(torch.rand(num_heads) * 2)  # (H,)
        self.r2 = nn.Parameter(torch.rand(num_heads))  # (H,)

    def relative_bias(self, relative: Tensor, layer: int) -> Tensor:
        """``(H, N)`` bias of relative positions ``relative`` ``(N,)``."""
        r1, r2 = self.r1.clamp(min=self.EPS), self.r2.clamp(min=self.EPS)
        return -r1[:, None] * torch.log1p(r2[:, None] * relative.abs().float())  # (H, N)

    def attention_bias_fn(self, q, k, q_positions, k_positions, layer) -> Optional[Callable]:
        """The bias as a function of indices: arithmetic only, no table read inside the kernel.

        Raises:
            ValueError: if the positions are not contiguous (``q0, q0 + 1, ...``).
        """
        offsets = []
        for name, p in (("q_positions", q_positions), ("k_positions", k_positions)):
            start = int(p[0])
            if not torch.equal(p, torch.arange(start, start + p.numel(), device=p.device)):
                raise ValueError(f"{name} must be contiguous (p0, p0 + 1, ...) for KerpleLogBias.attention_bias_fn, "
                                 f"got {p[:6].tolist()}{' ...' if p.numel() > 6 else ''}")
            offsets.append(start)
        shift = offsets[1] - offsets[0]  # key position - query position = kv_idx - q_idx + shift
        r1, r2 = self.r1.clamp(min=self.EPS), self.r2.clamp(min=self.EPS)  # (H,)

        def bias_fn(b, h, q_idx, kv_idx):
            return -r1[h] * torch.log1p(r2[h] * (kv_idx - q_idx + shift).abs())

        return bias_fn


def build_bias_method(name: str, H: int) -> nn.Module:
    """The position method whose bias is measured."""
    from posenc.alibi import ALiBi
    from posenc.relative import T5RelativeBias

    if name == "alibi":
        return ALiBi(H)
    if name == "kerple":
        return KerpleLogBias(H)
    return T5RelativeBias(H, bidirectional=False)


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _profile(step: Callable, reset: Callable, sync: Callable, device: torch.device, iters: int = 3) -> dict:
    """Top operations (kernels, on a GPU) by self device time over ``iters`` calls of ``step``."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        for _ in range(iters):
            reset()
            step()
        sync()
    averages = prof.key_averages()
    attr = "self_cpu_time_total"
    if cuda:
        attr = "self_device_time_total" if hasattr(averages[0], "self_device_time_total") else "self_cuda_time_total"
    total = sum(getattr(e, attr) for e in averages) or 1.0
    top = sorted(averages, key=lambda e: getattr(e, attr), reverse=True)[:15]
    try:
        table = averages.table(sort_by=attr, row_limit=15, max_name_column_width=80)
    except Exception as err:  # the table is a convenience; the rows below are the record
        table = f"(no table: {type(err).__name__}: {err})"
    return {
        "iters": iters, "sorted_by": attr, "ms_per_iter": total / 1e3 / iters, "table": table,
        "top": [{"name": e.key, "calls_per_iter": e.count / iters, "ms_per_iter": getattr(e, attr) / 1e3 / iters,
                 "share": getattr(e, attr) / total} for e in top if getattr(e, attr) > 0],
    }


def run_one(cfg: dict, args: argparse.Namespace) -> dict:
    """Measure one configuration in this process; save its output (and gradients) to ``cfg["out"]``."""
    import warnings

    import torch.nn.functional as F

    from posenc.attention import attention, causal_mask

    T, backend, method_name = cfg["T"], cfg["backend"], cfg["method"] or "t5"
    device, dtype = torch.device(args.device), DTYPES[args.dtype]
    B, H, D = args.batch, args.heads, args.head_dim
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, T, D, device=device, dtype=dtype) for _ in range(3))
    grad_out = torch.randn(B, H, T, D, device=device, dtype=dtype) if args.backward else None
    pos = torch.arange(T, device=device)
    method = build_bias_method(method_name, H).to(device)
    params = [p for p in method.parameters()]
    for p in params:
        p.requires_grad_(args.backward and not args.no_bias_grad)
    if backend == FLASH:
        from flash_attn import flash_attn_func

        # flash-attn's layout is (B, T, H, D), the one a model's projections produce: no transpose is timed
        q, k, v = (x.transpose(1, 2).contiguous() for x in (q, k, v))  # (B, T, H, D)
        grad_out = grad_out.transpose(1, 2).contiguous() if grad_out is not None else None
    leaves = [q, k, v] + [p for p in params if p.requires_grad]
    if args.backward:
        for x in (q, k, v):
            x.requires_grad_()

    def call():
        if backend == FLOOR:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        if backend == "sdpa, no bias":
            return attention(q, k, v, causal=True, backend="sdpa")
        if backend == "sdpa, causal mask":
            return F.scaled_dot_product_attention(q, k, v, attn_mask=~causal_mask(T, T, device=device))
        if backend == "flex, no bias":
            return attention(q, k, v, causal=True, backend="flex")
        if backend == FLASH:
            return flash_attn_func(q, k, v, causal=True, alibi_slopes=method.slopes)  # (B, T, H, D)
        if backend in ("flex", "sdpa + bias_fn"):
            fn = method.attention_bias_fn(q, k, pos, pos, 0)
            return attention(q, k, v, bias_fn=fn, causal=True, backend="flex" if backend == "flex" else "sdpa")
        bias = method.attention_bias(q, k, pos, pos, 0)  # (1, H, T, S)
        return attention(q, k, v, bias=bias, causal=True, backend="reference" if backend == "reference" else "sdpa")

    def step():
        out = call()
        if args.backward:
            out.backward(grad_out)
        return out

    def reset():
        for x in leaves:
            x.grad = None

    row = {"T": T, "backend": backend, "method": cfg["method"]}
    with torch.enable_grad() if args.backward else torch.no_grad():
        reset()
        start = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = step()  # warm-up (compiles flex)
            sync()
        row["first_call_s"] = round(time.perf_counter() - start, 2)
        fallback = [str(w.message) for w in caught if "fell back" in str(w.message)]
        if fallback:
            row["fallback"] = fallback[0]
        if cfg.get("compile_only"):
            return row
        del out
        reset()
        gc.collect()
        start = time.perf_counter()
        if cuda:
            sync()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            out = step()
            sync()
            peak = torch.cuda.max_memory_allocated() - base
        else:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # reset the peak resident set to the current one
            base = _rss_kib("VmRSS")
            out = step()
            peak = (_rss_kib("VmHWM") - base) * 1024
        seconds = max(time.perf_counter() - start, 1e-6)  # one call, compiled: sizes the rest to --time-budget
        fits = int(args.time_budget / seconds)
        repeats = min(args.repeats, max(3, fits))  # slow calls: fewer timed repeats, never fewer than 3
        warmup = min(args.warmup, max(0, fits - repeats))
        if cfg.get("out"):
            as_bhtd = (lambda x: x.transpose(1, 2)) if backend == FLASH else (lambda x: x)  # noqa: E731
            saved = {"out": as_bhtd(out.detach()).cpu()}
            if args.backward:
                saved["grads"] = [as_bhtd(x.grad).cpu() for x in (q, k, v)]
                saved["param_grads"] = [p.grad.cpu() for p in params if p.grad is not None]
            torch.save(saved, cfg["out"])
            del saved
        del out
        for _ in range(warmup):
            reset()
            step()
        times = []
        if cuda:
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(repeats):
            reset()
            if cuda:
                begin.record()
                step()
                end.record()
                end.synchronize()
                times.append(begin.elapsed_time(end))
            else:
                start = time.perf_counter()
                step()
                times.append(1e3 * (time.perf_counter() - start))
        row.update(ms=statistics.median(times), ms_min=min(times), ms_max=max(times), repeats=repeats,
                   warmup=warmup, timer="cuda events" if cuda else "wall clock", peak_bytes=peak)
        if cfg.get("profile"):
            row["profile"] = _profile(step, reset, sync, device, iters=3 if 3 * seconds < args.time_budget else 1)
    return row


def _child(cfg: dict, args: argparse.Namespace, env: Optional[dict] = None) -> dict:
    """Run one configuration in a fresh process; a timeout or a failure comes back as ``{"status": ...}``."""
    cmd = [sys.executable, os.path.abspath(__file__), "--device", args.device, "--dtype", args.dtype,
           "--batch", str(args.batch), "--heads", str(args.heads), "--head-dim", str(args.head_dim),
           "--repeats", str(args.repeats), "--warmup", str(args.warmup), "--time-budget", str(args.time_budget),
           "--single", json.dumps(cfg)]
    cmd += ["--backward"] * args.backward + ["--no-bias-grad"] * args.no_bias_grad
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)  # its own process group: a timeout ends its compile workers too
    _RUNNING.add(proc)
    try:
        stdout, stderr = proc.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return {"status": f"timeout: no result after {args.timeout:g} s"}
    finally:
        _RUNNING.discard(proc)
    for line in reversed(stdout.splitlines()):
        if line.startswith(RESULT):
            return json.loads(line[len(RESULT):])
    lines = [line for line in stderr.strip().splitlines() if line.strip()] or [f"exit code {proc.returncode}"]
    return {"status": f"failed: {lines[-1].strip()[:300]}"}


def _single(args: argparse.Namespace) -> None:
    cfg = json.loads(args.single)
    try:
        row = run_one(cfg, args)
    except ImportError as err:
        row = {"status": f"not installed: {type(err).__name__}: {err}"}
    except getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError) as err:
        row = {"status": f"out of memory: {str(err).splitlines()[0][:240]}"}
    except Exception as err:
        row = {"status": f"failed: {type(err).__name__}: {(str(err).splitlines() or [''])[0][:240]}"}
    print(RESULT + json.dumps(row), flush=True)


def _git(*cmd: str) -> Optional[str]:
    try:
        done = subprocess.run(["git", *cmd], capture_output=True, text=True,
                              cwd=os.path.dirname(os.path.abspath(__file__)))
    except OSError:
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _versions() -> dict:
    from importlib import metadata

    found = {}
    for key, dist in (("triton", "triton"), ("flash_attn", "flash-attn")):
        try:
            found[key] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            found[key] = None
    return found


def _max_diff(a: Tensor, b: Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


def _rel_diff(a: Tensor, b: Tensor) -> float:
    return _max_diff(a, b) / max(b.float().abs().max().item(), 1e-30)


def _fmt(x: Optional[float], spec: str) -> str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--method", choices=METHODS, nargs="+", default=["t5"],
                        help="which relative bias(es) to measure")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="float32", help="dtype of q, k, v (and of the bias)")
    parser.add_argument("--backward", action="store_true", help="time and peak of forward + backward")
    parser.add_argument("--no-bias-grad", action="store_true",
                        help="with --backward: no gradient for the bias parameters")
    parser.add_argument("--batch", type=int, default=1, help="B")
    parser.add_argument("--heads", type=int, default=8, help="H")
    parser.add_argument("--head-dim", type=int, default=64, help="D")
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 8192],
                        help="T = S, measured in this order")
    parser.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(BACKENDS),
                        help=f"which backends to measure ({FLOOR!r} is always measured)")
    parser.add_argument("--repeats", type=int, help="timed calls (default 2 on the CPU, 10 on CUDA)")
    parser.add_argument("--warmup", type=int, help="untimed calls after the first (default 0 on the CPU, 3 on CUDA)")
    parser.add_argument("--skip-reference-above", type=int, default=4096,
                        help="skip the reference backend above this T")
    parser.add_argument("--skip-bias-above", type=int,
                        help="skip the backends that materialise a (B, H, T, S) bias above this T")
    parser.add_argument("--timeout", type=float, default=300, help="seconds allowed to each configuration's process")
    parser.add_argument("--time-budget", type=float, default=30,
                        help="seconds of timed calls per configuration: slower calls get fewer repeats (at least 3)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="compile the flex configurations first in this many parallel processes")
    parser.add_argument("--profile", action="store_true", help="profile the floor and the flex rows at the largest T")
    parser.add_argument("--json", help="also write the rows and the machine description to this file")
    parser.add_argument("--single", help=argparse.SUPPRESS)
    args = parser.parse_args()
    cuda = torch.device(args.device).type == "cuda"
    args.repeats = args.repeats if args.repeats is not None else (10 if cuda else 2)
    args.warmup = args.warmup if args.warmup is not None else (3 if cuda else 0)
    for name in ("batch", "heads", "head_dim", "repeats", "jobs"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.warmup < 0:
        parser.error(f"--warmup must be >= 0, got {args.warmup}")
    return args


def _precompile(todo: list, args: argparse.Namespace) -> list:
    """Run the flex configurations once, ``args.jobs`` at a time, to fill Inductor's on-disk caches."""
    env = dict(os.environ, TORCHINDUCTOR_COMPILE_THREADS=str(max(1, (os.cpu_count() or 1) // args.jobs)))
    with ThreadPoolExecutor(args.jobs) as pool:
        done = list(pool.map(lambda c: _child(dict(c, compile_only=True), args, env), todo))
    return [dict(c, **r) for c, r in zip(todo, done)]


def _compare(rows: list, files: dict, backward: bool) -> None:
    """Add to each row its differences from its reference and its ratios to the floor, in place.

    The reference of a biased row is the ``reference`` backend of its method, else ``sdpa + bias``;
    that of a bias-free row is ``sdpa, is_causal``.
    """
    by = {(r["backend"], r["method"]): r for r in rows}
    floor = by.get((FLOOR, None))
    loaded = {}

    def load(key):
        if key not in loaded:
            loaded[key] = torch.load(files[key]) if key in files else None
        return loaded[key]

    for r in rows:
        key, m = (r["backend"], r["method"]), r["method"]
        if m is None:
            ref_key = (FLOOR, None) if key != (FLOOR, None) else None
        else:
            ref_key = next(((b, m) for b in ("reference", "sdpa + bias") if (b, m) in files), None)
        ref, mine = (load(ref_key), load(key)) if ref_key else (None, None)
        both = ref is not None and mine is not None
        r["max_abs_diff"] = _max_diff(mine["out"], ref["out"]) if both else None
        if backward:
            r["grad_max_abs_diff"] = max(_max_diff(a, b) for a, b in zip(mine["grads"], ref["grads"])) if both else None
            params = list(zip(mine["param_grads"], ref["param_grads"])) if both else []
            r["param_grad_rel_diff"] = max(_rel_diff(a, b) for a, b in params) if params else None
        r["ms_ratio"] = r["ms"] / floor["ms"] if floor else None
        r["peak_ratio"] = r["peak_bytes"] / floor["peak_bytes"] if floor and floor["peak_bytes"] > 0 else None


def _goal(rows: list, T: int, methods: list) -> list:
    """The goal's check at length T: flex against the floor, beside flex without a bias."""
    by = {(r["backend"], r["method"]): r for r in rows}
    if (FLOOR, None) not in by or T < GOAL_MIN_T:
        return []
    free = by.get(("flex, no bias", None))
    found = []
    for m in methods:
        flex = by.get(("flex", m))
        if flex and "fallback" not in flex:  # a fallback is not flex
            found.append({"T": T, "method": m, "ms_ratio": flex["ms_ratio"], "peak_ratio": flex["peak_ratio"],
                          "no_bias_ms_ratio": free["ms_ratio"] if free else None,
                          "no_bias_peak_ratio": free["peak_ratio"] if free else None,
                          "met": flex["ms_ratio"] <= GOAL_TIME and flex["peak_ratio"] is not None
                          and flex["peak_ratio"] <= GOAL_PEAK})
    return found


def _row_line(r: dict, backward: bool) -> str:
    grads = f" {_fmt(r.get('grad_max_abs_diff'), '.1e')} | {_fmt(r.get('param_grad_rel_diff'), '.1e')} |"
    return (f"| {r['T']} | {METHOD_NAMES.get(r['method'], '')} | {r['backend']} | {r['ms']:.2f} "
            f"| {r['ms_min']:.2f}-{r['ms_max']:.2f} "
            f"| {_fmt(r['ms_ratio'], '.2f')} | {r['peak_bytes'] / 2**20:.1f} | {_fmt(r['peak_ratio'], '.2f')} "
            f"| {_fmt(r['max_abs_diff'], '.1e')} |{grads if backward else ''}")


def main() -> None:
    args = _parse_args()
    if args.single:
        _single(args)
        return

    import platform
    from importlib.util import find_spec

    start = time.perf_counter()
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    B, H, D, dtype = args.batch, args.heads, args.head_dim, DTYPES[args.dtype]
    methods = list(dict.fromkeys(args.method))
    backends = [b for b in BACKENDS if b in args.backends or b == FLOOR]
    name = torch.cuda.get_device_name(device) if cuda else f"CPU, {torch.get_num_threads()} threads"
    biases = ", ".join(METHOD_NAMES[m] for m in methods)
    header = f"{name}, torch {torch.__version__} (B={B}, H={H}, D={D}, {args.dtype}, causal, {biases} bias"
    header += (", forward + backward" + (", bias frozen" if args.no_bias_grad else "") if args.backward else "") + ")"
    print(header + "\n", flush=True)

    def configs(T):
        """(backend, method) pairs at length T: the bias-free ones once, the others once per method."""
        pairs = [(b, None) for b in backends if b in NO_BIAS]
        for m in methods:
            pairs += [(b, m) for b in backends if b not in NO_BIAS and (b != FLASH or m == "alibi")]
        return pairs

    commit = _git("rev-parse", "--short", "HEAD")
    provenance = {
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "commit": commit or os.environ.get("POSENC_COMMIT"),
        "dirty": None if commit is None else bool(_git("status", "--porcelain", "--untracked-files=no")),
        "torch": torch.__version__, **_versions(), "cuda": torch.version.cuda if cuda else None, "device": name,
        "dtype": args.dtype, "backward": args.backward, "bias_grad": args.backward and not args.no_bias_grad,
        "B": B, "H": H, "D": D, "methods": methods, "lengths": args.lengths, "repeats": args.repeats,
        "warmup": args.warmup, "host": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
    }
    results, not_measured, profiles, goal, scratch = [], [], [], [], []

    def save(complete: bool) -> None:
        if not args.json:
            return
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        provenance.update(wall_s=round(time.perf_counter() - start, 1), complete=complete)
        with open(args.json, "w") as f:
            json.dump({"machine": header, "floor": FLOOR, "provenance": provenance, "rows": results,
                       "not_measured": not_measured, "profiles": profiles, "goal": goal}, f, indent=1)

    def stop(signum, frame):  # `timeout` or Ctrl-C: end the children (their own process groups), keep the rows
        for proc in list(_RUNNING):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        save(complete=False)
        for folder in scratch:
            shutil.rmtree(folder, ignore_errors=True)
        print(f"\nstopped by signal {signum}; the rows so far are saved", file=sys.stderr, flush=True)
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)

    timed_env = None
    if args.jobs > 1:  # fill Inductor's caches in parallel; the timed processes below then load the kernels
        timed_env = dict(os.environ, TORCHINDUCTOR_COMPILE_THREADS="1")  # no pool of compile workers beside the timing
        t0 = time.perf_counter()
        todo = [{"T": T, "backend": b, "method": m} for T in args.lengths for b, m in configs(T) if b in FLEX]
        provenance["precompile"] = _precompile(todo, args)
        provenance["precompile_s"] = round(time.perf_counter() - t0, 1)
        ok = sum("status" not in r for r in provenance["precompile"])
        print(f"compiled {ok} of {len(todo)} flex configurations in {provenance['precompile_s']} s, "
              f"{args.jobs} at a time\n", flush=True)

    grad_cols = " max abs diff of dq, dk, dv | bias-parameter grad rel. diff |" if args.backward else ""
    print("| T | method | backend | time (ms) | min-max (ms) | time / SDPA is_causal | peak memory (MiB) "
          f"| peak / SDPA is_causal | max abs diff vs reference |{grad_cols}")
    print("| --- " * (9 + 2 * args.backward) + "|", flush=True)
    blank = " |" * (5 + 2 * args.backward)
    flash_missing = "skipped: flash-attn needs CUDA" if not cuda else (
        None if find_spec("flash_attn") else "not installed (no module flash_attn)")
    flash_reported = False  # the missing flash-attn gets one row, not one per length
    itemsize = torch.finfo(dtype).bits // 8
    with tempfile.TemporaryDirectory(prefix="relative_bias-") as tmp:
        scratch.append(tmp)
        for T in args.lengths:
            pairs, rows, files, skipped = configs(T), [], {}, []
            for backend, m in pairs:
                if backend == "reference" and T > args.skip_reference_above:
                    skipped.append((backend, m, f"skipped: T > --skip-reference-above {args.skip_reference_above}"))
                elif backend in MATERIALISED and args.skip_bias_above is not None and T > args.skip_bias_above:
                    size = B * H * T * T * itemsize
                    size = f"{size / 2**30:.1f} GiB" if size >= 2**30 else f"{size / 2**20:.1f} MiB"
                    status = f"skipped: materialised bias of {size} (B*H*T*S = {B}*{H}*{T}*{T}, {args.dtype})"
                    skipped.append((backend, m, status))
                elif backend == FLASH and flash_missing and not flash_reported:
                    skipped.append((backend, m, flash_missing))
                    flash_reported = True
            skip = {(b, m) for b, m, _ in skipped} | ({(FLASH, "alibi")} if flash_missing else set())
            with_ref = {m: any((b, m) in pairs and (b, m) not in skip for b in ("reference", "sdpa + bias"))
                        for m in methods}  # will this method's outputs have something to be compared with?
            for backend, m in pairs:
                if (backend, m) in skip:
                    continue
                path = os.path.join(tmp, f"{T}-{m}-{BACKENDS.index(backend)}.pt")
                keep = with_ref[m] if m is not None else True  # save the outputs only where they will be compared
                cfg = {"T": T, "backend": backend, "method": m, "out": path if keep else None,
                       "profile": args.profile and backend in PROFILED and T == max(args.lengths)}
                row = _child(cfg, args, timed_env)
                if "status" in row:
                    if backend == FLASH and row["status"].startswith("not installed"):
                        flash_missing, flash_reported = row["status"], True
                    skipped.append((backend, m, row["status"]))
                    continue
                if "profile" in row:
                    profiles.append({"T": T, "backend": backend, "method": m, **row.pop("profile")})
                rows.append(row)
                if keep:
                    files[(backend, m)] = path
            _compare(rows, files, args.backward)
            for path in files.values():
                os.remove(path)
            for r in rows:
                print(_row_line(r, args.backward))
            for backend, m, status in skipped:
                print(f"| {T} | {METHOD_NAMES.get(m, '')} | {backend} | {status} |{blank}")
                not_measured.append({"T": T, "backend": backend, "method": m, "status": status})
            results.extend(rows)
            goal.extend(_goal(rows, T, methods))
            sys.stdout.flush()
            save(complete=False)
    if goal:
        print(f"\nGoal: flex within {GOAL_TIME}x of the time and {GOAL_PEAK}x of the peak of {FLOOR!r} "
              f"at T >= {GOAL_MIN_T}\n")
        print("| T | method | flex time / floor | flex peak / floor | flex, no bias: time / floor | peak / floor "
              "| goal |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for g in goal:
            print(f"| {g['T']} | {METHOD_NAMES[g['method']]} | {g['ms_ratio']:.2f} | {_fmt(g['peak_ratio'], '.2f')} "
                  f"| {_fmt(g['no_bias_ms_ratio'], '.2f')} | {_fmt(g['no_bias_peak_ratio'], '.2f')} "
                  f"| {'met' if g['met'] else 'missed'} |")
    for p in profiles:
        print(f"\nProfile, T = {p['T']}, {p['backend']}{', ' + METHOD_NAMES[p['method']] if p['method'] else ''} "
              f"({p['ms_per_iter']:.2f} ms per call, by {p['sorted_by']}):\n{p['table']}")
    save(complete=True)


if __name__ == "__main__":
    main()
