"""Shared pytest setup: the ``gpu`` marker skips cleanly without CUDA; every test starts from seed 0.

Without CUDA the Triton kernels run in Triton's CPU interpreter: TRITON_INTERPRET must be set
before any kernel is decorated, so it is set here, before the test modules import pathtune.
"""
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
