"""Time of applying RoPE to one query (or key) tensor, against the common eager formulation and a copy.

For both layouts and every dtype asked for (float32, bfloat16 and float16 by default), a prefill shape
``(1, 32, 2048, 128)`` and a decode shape ``(8, 32, 1, 128)`` (eight sequences, one new token each)
whose cos/sin row is read from a 32768-position cache (position 32767), compares:

* ``copy``: ``x.clone()``, the physical floor (RoPE reads ``x`` once and writes a new tensor once);
* ``copy into existing``: ``out.copy_(x)``, the same traffic without allocating the result (on the
  CPU a fresh 32 MiB result costs page faults that a real model also pays, so ``copy`` is the fair
  floor for functions that return a new tensor);
* ``hf eager``: ``x * cos_full + rotate_half(x) * sin_full``, the Hugging Face style, with
  full-width cos/sin cast to ``x``'s dtype (for ``interleaved``, the GPT-J style pair swap);
* ``hf compiled``: the same function under ``torch.compile``, the strongest baseline a user of that
  formulation would pick (it separates what fusion gains from what the formulation gains);
* ``posenc eager``: :func:`posenc.rope.apply_rope` with ``backend="eager"``;
* ``posenc compiled``: ``backend="compiled"`` (``torch.compile`` of the same function);
* ``posenc auto``: the default, compiled from ``COMPILE_MIN_NUMEL`` elements on, eager below;
* ``control: one cos/sin row`` (prefill): ``posenc auto`` with a single cos/sin row broadcast to
  every position, the same traffic in ``x`` without the tables' (at ``T = 2048`` the fp32 tables
  are 1 MiB, read once per head): what the tables cost;
* ``compiled, rounded after join`` (bf16): :func:`rope_rounded_after_join` below under
  ``torch.compile``, a full-rotary restatement of ``posenc.rope.apply_rope_eager`` as it was before
  commit 4416cc6, which joined the two rotated halves in fp32 and rounded the joined tensor: on the
  CPU the compiler then writes an fp32 intermediate of the whole result (twice the result's memory)
  and rounds it in a second pass.

(Runs before posenc 0.2.1 also timed a "candidate: packed pairs" kernel that read interleaved bf16
pairs as 32-bit words through PyTorch's 16-bit conversions; :mod:`posenc.rope.packed` now does this
with integer conversions that vectorise, and it is what ``posenc compiled`` runs for those inputs.)

On the CPU the result's allocation can cost more than the computation: glibc gives a freed block
above its mmap threshold (adaptive, at most 32 MiB) back to the system, and the next fresh result is
faulted in page by page. PyTorch's CPU tensors come from malloc, so a real model pays this too, but
it hides the kernels' own speed. For kernel-only numbers run with
``MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=4294967296`` (glibc then keeps freed
memory); each row records these settings, the torch version and the repository commit of the run.

Reports the median wall time per call (what a Python caller waits, launch overheads included), the
effective bandwidth (bytes of ``x`` read + written over that time), the ratio to the copy, the
speed-up over ``hf eager`` and over ``hf compiled``, and the largest difference between the
compiled and eager outputs. The
implementations of one configuration are timed in turns, so that the slow phases of a noisy machine
fall on all of them alike. On CUDA it also reports the GPU kernel time per call (from
``torch.profiler``, one implementation after the other) and the bandwidth the kernels reach, as a
percentage of the copy kernel's: at these sizes the wall time of a compiled call or a copy is mostly
the CPU's launch overhead, which the GPU's own time does not include.

Usage (from the repository root): python benchmarks/rope.py [--device cuda] [--repeats 30]
[--json benchmarks/results/rope_cpu.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from attention_backends import bench_in_turns  # noqa: E402

from posenc.rope import RotaryEmbedding, apply_rope  # noqa: E402

MALLOC_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


def posenc_commit() -> str | None:
    """The repository commit being measured (``+changes`` if its code or benchmark scripts differ
    from it; saved results do not count), or None outside a git checkout."""
    import subprocess

    def git(*args: str) -> str:
        here = os.path.dirname(os.path.abspath(__file__))
        return subprocess.run(["git", *args], capture_output=True, text=True, check=True, cwd=here).stdout.strip()

    try:
        dirty = git("status", "--porcelain", "--untracked-files=no", "--", ":(top)code", ":(top)benchmarks/*.py")
        return git("rev-parse", "--short", "HEAD") + ("+changes" if dirty else "")
    except (OSError, subprocess.CalledProcessError):  # a copy of the tree without .git: the caller may say
        return os.environ.get("POSENC_COMMIT")


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


def rope_rounded_after_join(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str) -> torch.Tensor:
    """The rotation with the halves joined in fp32 and the result rounded afterwards (for comparison;
    same values as ``apply_rope_eager``). Full rotary only: cos/sin ``(T, D/2)``."""
    xa, xb = (x[..., ::2], x[..., 1::2]) if layout == "interleaved" else x.chunk(2, dim=-1)
    ya, yb = xa * cos - xb * sin, xb * cos + xa * sin  # fp32 by type promotion
    y = torch.stack([ya, yb], dim=-1).flatten(-2) if layout == "interleaved" else torch.cat([ya, yb], dim=-1)
    return y.to(x.dtype)


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


# --------------------------------------------------------------------------- the q/k suite (GPU)


def gpu_ms(fn, budget_ms: float = 60.0, flush_mb: int = 256) -> float:
    """Median GPU time of one call of ``fn`` (ms), from CUDA events around each call, with the L2
    cache overwritten before every call (so that no call reads what the previous one left there).

    The flush and the events are queued ahead of the call, so the interval is the GPU's own time
    (launch overheads that overlap earlier work are not counted)."""
    flush = torch.empty(flush_mb << 20, dtype=torch.uint8, device="cuda")
    fn()
    torch.cuda.synchronize()
    est = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    est[0].record()
    for _ in range(5):
        fn()
    est[1].record()
    torch.cuda.synchronize()
    n = int(min(500, max(20, budget_ms / max(est[0].elapsed_time(est[1]) / 5, 1e-3))))
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
    for a, b in events:
        flush.zero_()
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    return sorted(a.elapsed_time(b) for a, b in events)[n // 2]


def wall_ms(fn, calls: int = 200, rounds: int = 5) -> float:
    """Median over ``rounds`` of the wall time per call of ``calls`` calls in a row, synchronised at
    the ends: what a caller waits per call when calls follow each other (launch overheads included)."""
    import time

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) / calls * 1e3)
    return sorted(times)[rounds // 2]


def hf_apply_rotary_pos_emb(q, k, cos, sin, layout):
    """Hugging Face's ``apply_rotary_pos_emb`` (``layout="half"``; Llama, Qwen, Mistral) and its
    GPT-J counterpart (``"interleaved"``): full-width cos/sin ``(B, 1, T, D)`` in ``q``'s dtype."""
    rot = rotate_half_hf if layout == "half" else rotate_every_two
    return q * cos + rot(q) * sin, k * cos + rot(k) * sin


def load_flash_attn_rotary(path: str | None):
    """flash-attention's Triton rotary (``flash_attn.ops.triton.rotary.apply_rotary``): imported from
    the installed package, or loaded from the file ``path`` (its source, for machines where the
    package's CUDA extension, which ``import flash_attn`` needs, cannot be built). None if neither."""
    try:
        from flash_attn.ops.triton.rotary import apply_rotary

        return apply_rotary, "flash_attn package"
    except Exception:
        pass
    if path and os.path.exists(path):
        import importlib.util

        spec = importlib.util.spec_from_file_location("fa_triton_rotary", path)
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except Exception as err:
            return None, f"{path} did not load: {type(err).__name__}: {err}"
        return module.apply_rotary, f"flash-attention's {os.path.basename(path)}"
    return None, "not installed"


def load_liger_rope():
    """Liger-Kernel's fused RoPE (``liger_kernel.ops.rope.LigerRopeFunction``): rotates q and k in
    place in their ``(B, T, H, D)`` storage, half layout only. None if not installed."""
    try:
        from liger_kernel.ops.rope import LigerRopeFunction

        return LigerRopeFunction.apply
    except Exception:
        return None


def qk_suite(args) -> None:
    """Rotating the queries and keys of one layer on a GPU (see ``--help``): every layout x dtype x
    length x head configuration, posenc's default path against a copy of q and k (the floor), the
    Hugging Face formulation eager and compiled, and the fused kernels that install."""
    import importlib.metadata
    import platform
    import time

    import torch._dynamo

    from posenc.rope import kernel as rope_kernel_module

    torch._dynamo.config.cache_size_limit = 512  # every shape its own graph, never a silent eager fallback
    if hasattr(torch._dynamo.config, "recompile_limit"):
        torch._dynamo.config.recompile_limit = 512
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device)
    versions = {}
    for pkg in ("torch", "triton", "transformers", "liger-kernel", "flash-attn"):
        try:
            versions[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            versions[pkg] = None
    fa_apply, fa_source = load_flash_attn_rotary(args.flash_attn_rotary)
    liger = load_liger_rope()
    started = time.perf_counter()
    provenance = dict(command=" ".join(["python", *sys.argv]), commit=posenc_commit(), device=name, host=platform.node(),
                      versions=versions, flash_attn_source=fa_source, tile=[rope_kernel_module.PAIRS_PER_PROGRAM, rope_kernel_module.NUM_WARPS],
                      kernel_default_on_cuda=rope_kernel_module.DEFAULT_ON_CUDA)
    print(json.dumps(provenance))
    rope = RotaryEmbedding(128, 32768).to(device)
    if args.tile_sweep:
        tile_sweep(args, rope, provenance)
    hf_compiled = torch.compile(hf_apply_rotary_pos_emb)
    rows = []
    print("| T | heads q/kv | dtype | layout | impl | GPU µs | % of copy bandwidth | wall µs | bit-identical to posenc eager |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for T in args.lengths:
        start = 32767 if T == 1 else 0  # decode: one row of a 32k cache
        cos, sin = rope.cos_sin(torch.arange(start, start + T, device=device))  # (T, 64) fp32
        for hq, hkv in args.heads:
            for dtype in [getattr(torch, d) for d in args.dtypes]:
                for layout in args.layouts:
                    torch.manual_seed(0)
                    # q and k as a model has them: projections (B, T, H, D) seen as (B, H, T, D)
                    q = torch.randn(1, T, hq, 128, device=device).to(dtype).transpose(1, 2)
                    k = torch.randn(1, T, hkv, 128, device=device).to(dtype).transpose(1, 2)
                    if layout == "half":
                        cf, sf = torch.cat([cos, cos], -1), torch.cat([sin, sin], -1)
                    else:
                        cf, sf = cos.repeat_interleave(2, -1), sin.repeat_interleave(2, -1)
                    cf, sf = cf[None, None].to(dtype), sf[None, None].to(dtype)  # (1, 1, T, D), as HF passes them
                    impls = {
                        "copy": lambda: (q.clone(), k.clone()),
                        "hf eager": lambda: hf_apply_rotary_pos_emb(q, k, cf, sf, layout),
                        "hf compiled": lambda: hf_compiled(q, k, cf, sf, layout),
                        "posenc eager": lambda: (apply_rope(q, cos, sin, layout, backend="eager"),
                                                 apply_rope(k, cos, sin, layout, backend="eager")),
                        "posenc compiled": lambda: (apply_rope(q, cos, sin, layout, backend="compiled"),
                                                    apply_rope(k, cos, sin, layout, backend="compiled")),
                        "posenc default": lambda: (apply_rope(q, cos, sin, layout), apply_rope(k, cos, sin, layout)),
                        "posenc triton": lambda: (apply_rope(q, cos, sin, layout, backend="triton"),
                                                  apply_rope(k, cos, sin, layout, backend="triton")),
                    }
                    if fa_apply is not None:
                        inter = layout == "interleaved"
                        impls["flash-attn triton"] = lambda: (
                            fa_apply(q.transpose(1, 2), cos, sin, interleaved=inter).transpose(1, 2),
                            fa_apply(k.transpose(1, 2), cos, sin, interleaved=inter).transpose(1, 2))
                    if liger is not None and layout == "half":
                        # in place: rotates the storage of its own copies of q and k again at every call
                        ql, kl = q.clone(), k.clone()
                        impls["liger (in place)"] = lambda: liger(ql, kl, cf[0], sf[0])[:2]
                    ref = impls["posenc eager"]()
                    checks = {}
                    for impl, fn in list(impls.items()):
                        if impl == "copy":
                            continue
                        try:
                            if impl.startswith("liger"):
                                ql.copy_(q), kl.copy_(k)
                            out = fn()
                            torch.cuda.synchronize()
                            diff = max((o.float() - r.float()).abs().max().item() for o, r in zip(out, ref))
                            same = all(torch.equal(o, r) for o, r in zip(out, ref))
                            checks[impl] = (diff, same)
                        except Exception as err:  # a baseline that cannot take this configuration
                            checks[impl] = (None, f"failed: {type(err).__name__}: {str(err).splitlines()[0][:120]}")
                            del impls[impl]
                    g = {impl: gpu_ms(fn) for impl, fn in impls.items()}
                    w = {impl: wall_ms(fn, calls=200 if T <= 2048 else 20) for impl, fn in impls.items()}
                    nbytes = 2 * (q.numel() + k.numel()) * q.element_size()
                    for impl in list(impls) + [i for i in checks if i not in impls]:
                        diff, same = checks.get(impl, (0.0, True))
                        row = dict(T=T, heads=[hq, hkv], dtype=str(dtype).replace("torch.", ""), layout=layout, impl=impl,
                                   shape_q=list(q.shape), shape_k=list(k.shape), max_abs_diff_vs_posenc_eager=diff,
                                   bit_identical_to_posenc_eager=same, device=name, commit=provenance["commit"],
                                   torch=torch.__version__)
                        if impl in g:
                            row.update(gpu_ms=g[impl], wall_ms=w[impl], gpu_gbps=nbytes / g[impl] / 1e6,
                                       pct_of_copy_bw=100 * g["copy"] / g[impl])
                            print(f"| {T} | {hq}/{hkv} | {row['dtype']} | {layout} | {impl} | {g[impl] * 1e3:.1f} | "
                                  f"{row['pct_of_copy_bw']:.0f}% | {w[impl] * 1e3:.1f} | {same} |", flush=True)
                        else:
                            print(f"| {T} | {hq}/{hkv} | {row['dtype']} | {layout} | {impl} | | | | {same} |", flush=True)
                        rows.append(row)
                    del q, k, impls
                    if args.json:  # written after every configuration, so that a run cut short keeps its rows
                        provenance["wall_s"] = round(time.perf_counter() - started, 1)
                        with open(args.json, "w") as f:
                            json.dump({"provenance": provenance, "rows": rows}, f, indent=1)


def tile_sweep(args, rope, provenance) -> None:
    """GPU time of posenc's kernel at several tile sizes (pairs per program, warps), bf16 and fp32,
    both layouts, MHA and GQA keys, T = 8192 and 32768: the measurement behind the defaults."""
    from posenc.rope import kernel as K

    tiles = [(512, 4), (1024, 4), (2048, 4), (4096, 4), (4096, 8), (8192, 8)]
    rows = []
    print("\n| T | heads | dtype | layout | " + " | ".join(f"{p} pairs, {w} warps" for p, w in tiles) + " | copy |")
    print("| --- | --- | --- | --- | " + " | ".join("---" for _ in tiles) + " | --- |")
    for T in args.sweep_lengths:
        cos, sin = rope.cos_sin(torch.arange(T, device=args.device))
        for H in (args.heads[0][0], args.heads[-1][1]):
            for dtype in (torch.bfloat16, torch.float32):
                x = torch.randn(1, T, H, 128, device=args.device).to(dtype).transpose(1, 2)
                for layout in ("half", "interleaved"):
                    copy = gpu_ms(lambda: x.clone())
                    res = {}
                    for tile in tiles:
                        res[tile] = gpu_ms(lambda: K._launch(x, cos, sin, layout, False, tile))
                    rows.append(dict(T=T, heads=H, dtype=str(dtype).replace("torch.", ""), layout=layout, copy_ms=copy,
                                     tiles={f"{p}x{w}": ms for (p, w), ms in res.items()}))
                    print(f"| {T} | {H} | {rows[-1]['dtype']} | {layout} | "
                          + " | ".join(f"{100 * copy / ms:.0f}%" for ms in res.values()) + f" | {copy * 1e3:.1f} µs |", flush=True)
    if args.json:
        with open(args.json.replace(".json", "_tiles.json"), "w") as f:
            json.dump({"provenance": provenance, "rows": rows}, f, indent=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--json", default=None)
    parser.add_argument("--suite", choices=["single", "qk"], default=None,
                        help="'single': one tensor, two shapes (the CPU default); 'qk': q and k of a layer over "
                             "lengths, dtypes, layouts and head counts, with GPU times (the CUDA default)")
    parser.add_argument("--lengths", type=int, nargs="+", default=[1, 2048, 8192, 32768], help="qk suite: T (1 = decode)")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16", "float16"], help="dtypes of x")
    parser.add_argument("--layouts", nargs="+", default=["half", "interleaved"])
    parser.add_argument("--heads", type=lambda s: tuple(int(v) for v in s.split("/")), nargs="+",
                        default=[(32, 32), (32, 8)], help="qk suite: query/key heads, e.g. 32/32 (MHA) 32/8 (GQA)")
    parser.add_argument("--flash-attn-rotary", default=None,
                        help="qk suite: path of flash-attention's flash_attn/ops/triton/rotary.py, if the package is not installed")
    parser.add_argument("--tile-sweep", action="store_true", help="qk suite: first time posenc's kernel at several tile sizes")
    parser.add_argument("--sweep-lengths", type=int, nargs="+", default=[8192, 32768], help="tile sweep: T")
    args = parser.parse_args()
    # every configuration (shape, dtype, layout) is a recompilation of the compiled baselines; past
    # torch.compile's default limit of 8 they would run eagerly without a word (as the "hf compiled"
    # decode rows in bf16 and fp16 of runs before posenc 0.2.1 did)
    torch._dynamo.config.recompile_limit = 64
    torch._dynamo.config.fail_on_recompile_limit_hit = True
    device = torch.device(args.device)
    if (args.suite or ("qk" if device.type == "cuda" else "single")) == "qk":
        if device.type != "cuda":
            parser.error("--suite qk measures GPU time and needs --device cuda")
        qk_suite(args)
        return
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    commit = posenc_commit()
    malloc = " ".join(f"{k}={os.environ[k]}" for k in MALLOC_ENV if k in os.environ) or "glibc defaults"
    print(f"device={name} torch={torch.__version__} commit={commit} malloc: {malloc}\n")
    rope = RotaryEmbedding(128, 32768).to(device)
    after_join = torch.compile(rope_rounded_after_join)
    hf_compiled = torch.compile(hf_eager)
    rows = []
    cuda_cols = (" kernel µs | kernel bandwidth, % of copy |", " --- | --- |") if device.type == "cuda" else ("", "")
    print("| shape | dtype | layout | impl | ms | GB/s | × copy | speed-up vs hf | vs hf compiled |" + cuda_cols[0])
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |" + cuda_cols[1])
    for shape, start in [((1, 32, 2048, 128), 0), ((8, 32, 1, 128), 32767)]:
        T = shape[2]
        cos, sin = rope.cos_sin(torch.arange(start, start + T, device=device))  # (T, 64) fp32
        for dtype in [getattr(torch, d) for d in args.dtypes]:
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
                    "hf compiled": lambda: hf_compiled(x, cf, sf, layout),
                    "posenc eager": lambda: apply_rope(x, cos, sin, layout, backend="eager"),
                    "posenc compiled": lambda: apply_rope(x, cos, sin, layout, backend="compiled"),
                    "posenc auto": lambda: apply_rope(x, cos, sin, layout),
                }
                if T > 1:  # the control: the same rotation with one cos/sin row broadcast to every position
                    impls["control: one cos/sin row"] = lambda: apply_rope(x, cos[:1], sin[:1], layout)
                if dtype == torch.bfloat16:
                    impls["compiled, rounded after join"] = lambda: after_join(x, cos, sin, layout)
                eager_out = impls["posenc eager"]()
                diff = max((impls[k]().float() - eager_out.float()).abs().max().item()
                           for k in ("posenc compiled", "compiled, rounded after join") if k in impls)
                hf_compiled_diff = (impls["hf compiled"]().float() - impls["hf eager"]().float()).abs().max().item()
                assert hf_compiled_diff <= 2 ** -5, f"compiled rotate_half disagrees with eager by {hf_compiled_diff}"
                hf_diff = (impls["hf eager"]().float() - eager_out.float()).abs().max().item()
                assert diff <= 2 ** -5, f"a compiled kernel disagrees with the eager one by {diff}"  # < 1 bf16 ulp at |y| < 8
                ms = bench_in_turns(impls, reps)
                kms = {k: kernel_ms(f, reps) for k, f in impls.items()} if device.type == "cuda" else {}
                nbytes = 2 * x.numel() * x.element_size()
                for impl, t in ms.items():
                    row = dict(
                        shape=list(shape), dtype=str(dtype).replace("torch.", ""), layout=layout, impl=impl, ms=t,
                        gbps=nbytes / t / 1e6, x_copy=t / ms["copy"], speedup_vs_hf=ms["hf eager"] / t,
                        speedup_vs_hf_compiled=ms["hf compiled"] / t,
                        max_diff_compiled_vs_eager=diff, max_diff_hf_vs_eager=hf_diff, device=name,
                        malloc={k: os.environ[k] for k in MALLOC_ENV if k in os.environ}, commit=commit,
                        torch=torch.__version__,
                    )
                    if kms:
                        row.update(kernel_ms=kms[impl], kernel_gbps=nbytes / kms[impl] / 1e6,
                                   kernel_pct_of_copy_bw=100 * kms["copy"] / kms[impl])
                    rows.append(row)
                    extra = f" {row['kernel_ms'] * 1e3:.1f} | {row['kernel_pct_of_copy_bw']:.0f}% |" if kms else ""
                    print(
                        f"| {tuple(shape)} | {row['dtype']} | {layout} | {impl} | {t:.4f} | {row['gbps']:.1f} | "
                        f"{row['x_copy']:.2f} | {row['speedup_vs_hf']:.2f} | {row['speedup_vs_hf_compiled']:.2f} |{extra}"
                    )
                print(f"<!-- compiled vs eager max |diff| {diff:.3g}; hf vs eager {hf_diff:.3g} -->")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
