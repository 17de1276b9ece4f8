"""Peak memory and time of causal attention with a relative bias (T5 or ALiBi), on every attention backend.

Compares, at T = S in {1024, 4096, 8192}, H = 8, D = 64, batch 1, float32:

* ``sdpa, is_causal``: ``torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)``
  called directly, no bias and no mask: the memory floor every other row is divided by;
* ``sdpa, no bias``: the same through ``posenc.attention(causal=True, backend="sdpa")`` (checks that
  the wrapper adds nothing to the floor);
* ``reference``: explicit scores and softmax, with the (1, H, T, S) bias materialised;
* ``sdpa + bias``: fused attention reading a (1, H, T, S) bias built by the caller; the wrapper must
  not overwrite the caller's tensor, so the causal mask goes into a masked copy (two biases' worth);
* ``sdpa + bias_fn``: the same bias given as a function, materialised inside the wrapper, which then
  writes the causal mask into it in place (one bias's worth);
* ``flex``: ``flex_attention`` evaluating the bias inside the kernel from a (H, T + S - 1) table.

The bias comes from :class:`posenc.relative.T5RelativeBias` (decoder setting: 32 buckets, max
distance 128; ``--method t5``, the default) or :class:`posenc.alibi.ALiBi` (``--method alibi``),
built inside the timed call as a model would build it every forward pass. Each
configuration runs in its own process, so peak memory is measured cleanly: on CUDA with
``torch.cuda.max_memory_allocated``, on the CPU from the process's peak resident set (``VmHWM``,
reset through ``/proc/self/clear_refs``, Linux only). Outputs are compared with the reference
backend (or with ``sdpa + bias`` where the reference is skipped).

Usage: python benchmarks/relative_bias.py [--method alibi] [--device cuda] [--lengths 1024 4096 8192] [--json results/relative_bias_cpu.json]
The defaults (reference skipped above T = 4096, 2 timed repeats) take about four minutes with one CPU thread.
Prints a Markdown table; with ``--json``, also saves the rows (the chapters on relative methods and
on ALiBi show the saved CPU and GPU results from ``benchmarks/results/``).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile

import torch

BACKENDS = ("sdpa, is_causal", "sdpa, no bias", "reference", "sdpa + bias", "sdpa + bias_fn", "flex")
FLOOR = "sdpa, is_causal"


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


METHODS = ("t5", "alibi")


def build_bias_method(name: str, H: int):
    """The position method whose bias is measured."""
    from posenc.alibi import ALiBi
    from posenc.relative import T5RelativeBias

    return ALiBi(H) if name == "alibi" else T5RelativeBias(H, bidirectional=False)


def run_one(T: int, backend: str, device: torch.device, repeats: int, out_path: str, method_name: str = "t5") -> dict:
    """Measure one configuration in this process; save the output tensor to ``out_path``."""
    from posenc.attention import attention
    from posenc.notebook import time_ms

    torch.manual_seed(0)
    H, D = 8, 64
    q, k, v = (torch.randn(1, H, T, D, device=device) for _ in range(3))
    pos = torch.arange(T, device=device)
    method = build_bias_method(method_name, H).to(device)

    def call():
        if backend == "sdpa, is_causal":
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        if backend == "sdpa, no bias":
            return attention(q, k, v, causal=True, backend="sdpa")
        if backend in ("flex", "sdpa + bias_fn"):
            fn = method.attention_bias_fn(q, k, pos, pos, 0)
            return attention(q, k, v, bias_fn=fn, causal=True, backend="flex" if backend == "flex" else "sdpa")
        bias = method.attention_bias(q, k, pos, pos, 0)  # (1, H, T, S)
        return attention(q, k, v, bias=bias, causal=True, backend="reference" if backend == "reference" else "sdpa")

    with torch.no_grad():
        out = call()  # warm-up (compiles flex)
        del out
        gc.collect()
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            out = call()
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated() - base
        else:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # reset the peak resident set to the current one
            base = _rss_kib("VmRSS")
            out = call()
            peak = (_rss_kib("VmHWM") - base) * 1024
        torch.save(out.cpu(), out_path)
        ms = time_ms(call, repeats, warmup=0)  # the untimed call above was the warm-up
    return {"T": T, "backend": backend, "ms": ms, "peak_bytes": peak}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--method", choices=METHODS, default="t5", help="which relative bias to measure")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 8192])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--skip-reference-above", type=int, default=4096, help="skip the reference backend above this T")
    parser.add_argument("--json", help="also write the rows and the machine description to this file")
    parser.add_argument("--single", nargs=3, metavar=("T", "BACKEND", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    device = torch.device(args.device)
    if args.single:
        T, backend, out_path = int(args.single[0]), args.single[1], args.single[2]
        print(json.dumps(run_one(T, backend, device, args.repeats, out_path, args.method)))
        return

    import platform
    import time

    start = time.perf_counter()
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    header = f"{name}, torch {torch.__version__} (B=1, H=8, D=64, float32, causal, {'ALiBi' if args.method == 'alibi' else 'T5'} bias)"
    print(header + "\n")
    results = []
    print("| T | backend | time (ms) | peak memory (MiB) | peak / SDPA is_causal | max abs diff vs reference |")
    print("| --- | --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as tmp:
        for T in args.lengths:
            rows, outs = [], {}
            for backend in BACKENDS:
                if backend == "reference" and T > args.skip_reference_above:
                    continue
                path = os.path.join(tmp, f"{T}-{backend.replace(' ', '_').replace(',', '').replace('+', 'plus')}.pt")
                cmd = [sys.executable, __file__, "--method", args.method, "--device", args.device, "--repeats", str(args.repeats),
                       "--single", str(T), backend, path]
                done = subprocess.run(cmd, capture_output=True, text=True)
                if done.returncode != 0:
                    print(f"| {T} | {backend} | failed: {done.stderr.strip().splitlines()[-1]} | | | |")
                    continue
                rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
                outs[backend] = torch.load(path)
            floor = next((r["peak_bytes"] for r in rows if r["backend"] == FLOOR), None)
            ref = outs.get("reference", outs.get("sdpa + bias"))
            for r in rows:
                diff = "" if r["backend"] in (FLOOR, "sdpa, no bias") or ref is None else f"{(outs[r['backend']] - ref).abs().max().item():.1e}"
                ratio = f"{r['peak_bytes'] / floor:.2f}" if floor else ""
                print(f"| {T} | {r['backend']} | {r['ms']:.1f} | {r['peak_bytes'] / 2**20:.1f} | {ratio} | {diff} |")
                results.append(dict(r, max_abs_diff=float(diff) if diff else None))
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        try:
            commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                    cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip() or None
        except OSError:
            commit = None
        provenance = {"command": " ".join([os.path.basename(sys.executable), *sys.argv]), "commit": commit,
                      "torch": torch.__version__, "host": platform.processor() or platform.machine(),
                      "threads": torch.get_num_threads(), "wall_s": round(time.perf_counter() - start, 1)}
        with open(args.json, "w") as f:
            json.dump({"machine": header, "floor": FLOOR, "provenance": provenance, "rows": results}, f, indent=1)


if __name__ == "__main__":
    main()
