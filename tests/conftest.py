"""Shared fixtures: every device-dependent test runs on CPU, and on CUDA when one is present.

``make test`` sets ``POSENC_REQUIRE_TRANSFORMERS=1``: there, a missing ``transformers`` fails the
run instead of silently skipping every Hugging Face parity test.
"""

import os

import pytest
import torch

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available")),
]


@pytest.fixture(params=DEVICES)
def device(request) -> torch.device:
    return torch.device(request.param)


def pytest_sessionstart(session) -> None:
    if os.environ.get("POSENC_REQUIRE_TRANSFORMERS") == "1":
        try:
            import transformers  # noqa: F401
        except ImportError as exc:
            raise pytest.UsageError(
                "POSENC_REQUIRE_TRANSFORMERS=1 but transformers cannot be imported, so the Hugging Face "
                f"parity tests would all be skipped ({exc}); install requirements.txt"
            ) from exc
