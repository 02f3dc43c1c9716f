"""Shared fixtures: tiny models built fresh for each test; nothing heavy at import."""

from __future__ import annotations

import pytest
import torch

from sample_models import get_sample


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def tiny_gpt2():
    return get_sample("tiny-gpt2").build()


@pytest.fixture
def overwrite_flag():
    """Turn on torch's overwrite-on-conversion flag for one test, and back off after."""
    before = torch.__future__.get_overwrite_module_params_on_conversion()
    torch.__future__.set_overwrite_module_params_on_conversion(True)
    try:
        yield
    finally:
        torch.__future__.set_overwrite_module_params_on_conversion(before)
