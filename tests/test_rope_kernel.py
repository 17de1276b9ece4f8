"""Tests of posenc.rope.kernel: the Triton RoPE kernel is bit-identical to the eager rotation, its
backward is the rotation by -θ, apply_rope's default path takes it on CUDA (once DEFAULT_ON_CUDA is
set) and only there, and arguments it cannot take go to the eager function (or, asked for by name,
raise)."""

import os
import subprocess
import sys

import pytest
import torch

from posenc.rope import apply_rope, apply_rope_eager, inverse_frequencies, kernel, rope_cos_sin
from posenc.rope.kernel import _bht_strides, unsupported_reason

LAYOUTS = ["half", "interleaved"]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
cuda_only = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available")
needs_kernel = pytest.mark.skipif(
    not torch.cuda.is_available() or kernel.triton is None, reason="needs CUDA and Triton"
)


def cos_sin(positions, R, device="cpu"):
    inv, _ = inverse_frequencies(R, 10000.0, device=device)
    return rope_cos_sin(torch.as_tensor(positions, device=device), inv)


def cases(device):
    """(x, cos, sin): the shapes and memory layouts a model hands the rotation."""
    g = torch.Generator().manual_seed(0)
    rnd = lambda *shape: torch.randn(*shape, generator=g).to(device)  # noqa: E731
    T = 37
    c, s = cos_sin(torch.arange(T) + 5, 128, device)  # (T, 64)
    yield "contiguous (B, H, T, D)", rnd(2, 4, T, 128), c, s
    yield "(B, T, H, D) seen as (B, H, T, D)", rnd(2, T, 6, 128).transpose(1, 2), c, s
    yield "q of a fused qkv projection", rnd(2, T, 3 * 5, 128)[:, :, :5].transpose(1, 2), c, s
    cb, sb = cos_sin(torch.randint(0, 9000, (2, 1, T)), 128, device)  # per-batch positions, past fp64 threshold
    yield "cos (B, 1, T, R/2)", rnd(2, 4, T, 128), cb, sb
    ch, sh = cos_sin(torch.randint(0, 500, (2, 3, T)), 128, device)
    yield "cos per head (B, H, T, R/2)", rnd(2, 3, T, 128), ch, sh
    cp, sp = cos_sin(torch.arange(T), 32, device)  # (T, 16)
    yield "partial rotary 32 of 80 (Phi-style D)", rnd(1, 5, T, 80), cp, sp
    c96, s96 = cos_sin(torch.arange(T), 96, device)
    yield "D = 96, 40 heads", rnd(1, 40, T, 96), c96, s96
    c256, s256 = cos_sin(torch.arange(3), 256, device)
    yield "D = 256", rnd(1, 2, 3, 256), c256, s256
    c1, s1 = cos_sin([32767], 128, device)
    yield "decode: one row", rnd(1, 32, 1, 128), c1, s1
    yield "2-D (T, D)", rnd(T, 128), c, s
    yield "5-D (B, G, H, T, D)", rnd(2, 2, 3, T, 128), c, s


# ----------------------------------------------------------------- the kernel on CUDA


@needs_kernel
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_kernel_is_bit_identical_to_the_eager_rotation(layout, dtype, monkeypatch):
    import posenc.rope.rotation as rotation

    used = []
    real = kernel.rope_kernel
    monkeypatch.setattr(rotation.kernel, "rope_kernel", lambda *a: used.append(1) or real(*a))
    monkeypatch.setattr(rotation.kernel, "DEFAULT_ON_CUDA", True)  # the default path, once it is switched on
    for name, x, c, s in cases("cuda"):
        x = x.to(dtype)
        out = apply_rope(x, c, s, layout)
        assert used, f"{name}: apply_rope's default did not take the kernel"
        used.clear()
        eager = apply_rope_eager(x, c, s, layout)
        assert out.dtype == x.dtype and out.shape == x.shape and out.is_contiguous(), name
        assert torch.equal(out, eager), f"{name}: max |diff| {(out.float() - eager.float()).abs().max().item()}"


@needs_kernel
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_kernel_backward_is_the_rotation_by_minus_theta(layout, dtype):
    for name, x, c, s in cases("cuda"):
        x = x.to(dtype).detach().requires_grad_(True)
        grad = torch.randn(x.shape, device="cuda").to(dtype)
        apply_rope(x, c, s, layout, backend="triton").backward(grad)
        x64 = x.detach().double().requires_grad_(True)
        apply_rope_eager(x64, c.double(), s.double(), layout).backward(grad.double())
        # fp32 arithmetic rounded once to x's dtype: within one rounding of the exact gradient
        tol = {torch.float32: 1e-5, torch.bfloat16: 2 ** -7 * 4, torch.float16: 2 ** -10 * 4}[dtype]
        torch.testing.assert_close(x.grad.double(), x64.grad, atol=tol, rtol=tol, msg=name)


@needs_kernel
def test_kernel_backward_takes_non_contiguous_gradients():
    c, s = cos_sin(torch.arange(16), 64, "cuda")
    x = torch.randn(2, 3, 16, 64, device="cuda", requires_grad=True)
    y = apply_rope(x, c, s, backend="triton")
    (y.transpose(-1, -2).contiguous().transpose(-1, -2) * 1).sum().backward()
    ref = x.detach().requires_grad_(True)
    apply_rope_eager(ref, c, s).sum().backward()
    torch.testing.assert_close(x.grad, ref.grad)


@needs_kernel
def test_gradcheck_in_fp32_against_finite_differences_of_the_eager_function():
    # the kernel computes in fp32, so gradcheck's fp64 finite differences run on the eager function;
    # the kernel's backward must equal the eager function's Jacobian-vector product
    c, s = cos_sin(torch.arange(5) * 997, 16, "cuda")
    x = torch.randn(1, 2, 5, 16, device="cuda", requires_grad=True)
    v = torch.randn(1, 2, 5, 16, device="cuda")
    (gk,) = torch.autograd.grad(apply_rope(x, c, s, "interleaved", backend="triton"), x, v)
    (ge,) = torch.autograd.grad(apply_rope_eager(x, c, s, "interleaved"), x, v)
    torch.testing.assert_close(gk, ge, atol=1e-6, rtol=1e-6)


@cuda_only
def test_default_path_falls_back_where_the_kernel_cannot_go(monkeypatch):
    import posenc.rope.rotation as rotation

    monkeypatch.setattr(rotation.kernel, "rope_kernel", lambda *a: pytest.fail("kernel called"))
    monkeypatch.setattr(rotation.kernel, "DEFAULT_ON_CUDA", True)
    c, s = cos_sin(torch.arange(8), 16, "cuda")
    x64 = torch.randn(1, 2, 8, 16, device="cuda", dtype=torch.float64)
    torch.testing.assert_close(apply_rope(x64, c, s), apply_rope_eager(x64, c, s), rtol=0, atol=0)
    # cos/sin that need gradients (e.g. learned frequencies): eager, and the gradient reaches them
    cg, sg = c.clone().requires_grad_(True), s.clone().requires_grad_(True)
    apply_rope(torch.randn(1, 2, 8, 16, device="cuda"), cg, sg).sum().backward()
    assert cg.grad is not None and sg.grad is not None
    # inside an outer compile the rotation is left to the compiler
    fn = torch.compile(lambda z: apply_rope(z, c, s), fullgraph=True)
    x = torch.randn(1, 2, 8, 16, device="cuda")
    torch.testing.assert_close(fn(x), apply_rope_eager(x, c, s), atol=2e-6, rtol=0)


@needs_kernel
def test_rotary_embedding_on_cuda_takes_the_kernel_and_matches_eager(monkeypatch):
    from posenc.rope import RotaryEmbedding

    monkeypatch.setattr(kernel, "DEFAULT_ON_CUDA", True)
    rope = RotaryEmbedding(64, 128, layout="interleaved").cuda().to(torch.bfloat16)
    q = torch.randn(2, 16, 4, 64, device="cuda", dtype=torch.bfloat16).transpose(1, 2)  # (B, H, T, D) view
    k = torch.randn(2, 16, 2, 64, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    pos = torch.arange(16, device="cuda")
    rq, rk = rope.transform_qk(q, k, pos, pos, 0)
    c, s = rope.cos_sin(pos)
    assert torch.equal(rq, apply_rope_eager(q, c, s, "interleaved"))
    assert torch.equal(rk, apply_rope_eager(k, c, s, "interleaved"))


# ----------------------------------------------------------------- anywhere


def test_the_default_path_waits_for_the_kernel_to_be_checked_on_a_gpu(monkeypatch):
    # DEFAULT_ON_CUDA is switched on in the commit that records the CUDA tests passing on a GPU
    import posenc.rope.rotation as rotation

    assert kernel.DEFAULT_ON_CUDA is False
    monkeypatch.setattr(rotation.kernel, "unsupported_reason", lambda *a: pytest.fail("kernel considered"))
    c, s = cos_sin(torch.arange(4), 8, "cuda" if torch.cuda.is_available() else "cpu")
    apply_rope(torch.randn(1, 2, 4, 8, device=c.device), c, s)


def test_unsupported_reasons_name_the_cause():
    c, s = cos_sin(torch.arange(4), 8)
    x = torch.randn(1, 1, 4, 8)
    if kernel.triton is None:
        assert unsupported_reason(x, c, s) == "Triton is not installed"
    elif not os.environ.get("TRITON_INTERPRET"):
        assert unsupported_reason(x, c, s) == "x is on cpu, the kernel runs on CUDA"
    if torch.cuda.is_available() and kernel.triton is not None:
        xc, cc, sc = x.cuda(), c.cuda(), s.cuda()
        assert "the kernel takes" in unsupported_reason(xc.double(), cc, sc)
        assert "the kernel takes" in unsupported_reason(xc, cc.double(), sc.double())
        assert "require gradients" in unsupported_reason(xc, cc.requires_grad_(True), sc)
        assert unsupported_reason(xc[..., :0, :], cc, sc) == "x is empty"
        assert "contiguous last dim" in unsupported_reason(xc.transpose(-1, -2).contiguous().transpose(-1, -2), c.cuda(), sc)


def test_backend_triton_on_the_cpu_raises_with_the_reason():
    c, s = cos_sin(torch.arange(4), 8)
    with pytest.raises(ValueError, match="the Triton RoPE kernel cannot take these arguments: .*(Triton|CUDA)"):
        apply_rope(torch.randn(1, 1, 4, 8), c, s, backend="triton")


def test_auto_on_the_cpu_never_tries_the_kernel(monkeypatch):
    import posenc.rope.rotation as rotation

    monkeypatch.setattr(rotation.kernel, "DEFAULT_ON_CUDA", True)
    monkeypatch.setattr(rotation.kernel, "rope_kernel", lambda *a: pytest.fail("kernel called"))
    monkeypatch.setattr(rotation.kernel, "unsupported_reason", lambda *a: pytest.fail("kernel considered"))
    c, s = cos_sin(torch.arange(4), 8)
    x = torch.randn(1, 2, 4, 8)
    assert torch.equal(apply_rope(x, c, s), apply_rope_eager(x, c, s))


def test_leading_dims_are_indexed_as_b_h_t_where_strides_allow():
    x = torch.empty(2, 3, 5, 8)
    assert _bht_strides(x) == (2, 3, 5, 120, 40, 8)
    assert _bht_strides(torch.empty(2, 5, 3, 8).transpose(1, 2)) == (2, 3, 5, 120, 8, 24)
    assert _bht_strides(torch.empty(5, 8)) == (1, 1, 5, 0, 0, 8)
    assert _bht_strides(torch.empty(4, 2, 3, 5, 8)) == (8, 3, 5, 120, 40, 8)  # (4, 2) merged
    assert _bht_strides(torch.empty(5, 8).expand(2, 3, 5, 8)) == (2, 3, 5, 0, 0, 8)  # broadcast cos
    assert _bht_strides(torch.empty(4, 2, 3, 5, 8).transpose(0, 1)) is None  # (2, 4) cannot merge
    assert _bht_strides(torch.empty(2, 3, 8, 5).transpose(-1, -2)) is None  # last dim not contiguous


@pytest.mark.skipif(kernel.triton is None, reason="Triton not installed (CUDA builds of PyTorch ship it)")
def test_kernel_under_the_triton_interpreter_on_the_cpu():
    # The same kernel, run by Triton's CPU interpreter: the index arithmetic, masks, layouts and
    # broadcasts are checked without a GPU. The interpreter truncates fp32 -> bf16 where the GPU rounds
    # to nearest even, so bf16 is compared with the truncated eager result there.
    script = r"""
import sys
import torch
from posenc.rope import apply_rope_eager, kernel
sys.path.insert(0, TESTS)
from test_rope_kernel import cases
for layout in ("half", "interleaved"):
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for name, x, c, s in cases("cpu"):
            x = x.to(dtype)
            y = kernel.rope_kernel(x, c, s, layout)
            if dtype == torch.bfloat16:
                e32 = apply_rope_eager(x.float(), c, s, layout)
                e = (e32.view(torch.int32) & ~0xFFFF).view(torch.float32).bfloat16()
            else:
                e = apply_rope_eager(x, c, s, layout)
            assert torch.equal(y, e), (layout, dtype, name)
            xr = x.detach().requires_grad_(True)
            g = torch.randn(x.shape).to(dtype)
            kernel.rope_kernel(xr, c, s, layout).backward(g)
            x64 = x.detach().double().requires_grad_(True)
            apply_rope_eager(x64, c.double(), s.double(), layout).backward(g.double())
            rtol = {torch.float32: 1e-6, torch.bfloat16: 2 ** -7, torch.float16: 2 ** -10}[dtype]  # one rounding
            torch.testing.assert_close(xr.grad.double(), x64.grad, rtol=rtol, atol=1e-5, msg=str((layout, dtype, name)))
print("ok")
"""
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, "-c", f"TESTS = {here!r}\n" + script], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]
