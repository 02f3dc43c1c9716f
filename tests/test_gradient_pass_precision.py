"""Gradient norms keep float64 precision from the kernel to the table."""

from __future__ import annotations

import torch

from inspector.offsets import gradient_l2_norms


def test_a_float64_norm_is_not_rounded_to_float32():
    # |[1 + 2**-40]| = 1 + 2**-40: exact in float64, 1.0 in float32
    grads = [torch.tensor([1.0 + 2**-40], dtype=torch.float64), torch.tensor([3.0, 4.0], dtype=torch.float32)]
    norms = gradient_l2_norms(grads)
    assert norms.tolist() == [1.0 + 2**-40, 5.0]
