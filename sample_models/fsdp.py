"""A small residual MLP laid out for FSDP2: one ``fully_shard`` unit per block.

Use it as ``sample_models/fsdp.py:build`` with ``python -m inspector distributed``::

    torchrun --nproc-per-node 2 -m inspector distributed sample_models/fsdp.py:build \\
        --shard fsdp --steps 3 -o run.jsonl

Sizes at the default width 32, hidden 128, 2 blocks (float32):
  stem Linear(32 features, 32): 32*32 + 32 = 1056
  each block: LayerNorm 64 + Linear(32, 128) 4224 + Linear(128, 32) 4128 = 8416; two: 16832
  norm LayerNorm(32): 64; head Linear(32, 10): 330
  total 18282 parameters; buffer ``scale`` 32 elements (replicated on every rank).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

FEATURES = 32


@dataclass(frozen=True)
class FSDPNetConfig:
    width: int = 32
    hidden: int = 128
    blocks: int = 2
    classes: int = 10


class Block(nn.Module):
    """Pre-norm residual MLP block: x + fc2(gelu(fc1(ln(x))))."""

    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, hidden)
        self.fc2 = nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(self.ln(x))))  # (B, C)


class FSDPNet(nn.Module):
    """Features (B, 32) -> class logits (B, classes); ``blocks`` are the FSDP units."""

    def __init__(self, config: FSDPNetConfig = FSDPNetConfig()) -> None:
        super().__init__()
        self.config = config
        self.stem = nn.Linear(FEATURES, config.width)
        self.blocks = nn.ModuleList([Block(config.width, config.hidden) for _ in range(config.blocks)])
        self.norm = nn.LayerNorm(config.width)
        self.head = nn.Linear(config.width, config.classes)
        self.register_buffer("scale", torch.ones(config.width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x) * self.scale   # (B, C)
        for block in self.blocks:
            x = block(x)                 # (B, C)
        return self.head(self.norm(x))   # (B, classes)

    def fsdp_units(self) -> list[nn.Module]:
        """The submodules to shard one by one before the model itself."""
        return list(self.blocks)


def build() -> FSDPNet:
    """The default FSDPNet, seeded so every rank starts from the same weights."""
    torch.manual_seed(0)
    return FSDPNet()


def build_wide() -> FSDPNet:
    """A wider one (width 512, hidden 2048, 4 blocks: 8,425,994 parameters) for timings."""
    torch.manual_seed(0)
    return FSDPNet(FSDPNetConfig(width=512, hidden=2048, blocks=4))


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def example_inputs(batch_size: int = 2) -> torch.Tensor:
    """A batch of features; each rank draws its own batch, as in data-parallel training."""
    return torch.randn(batch_size, FEATURES, generator=torch.Generator().manual_seed(100 + _rank()))


def loss(outputs: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
    targets = torch.arange(outputs.size(0), device=outputs.device) % outputs.size(1)
    return F.cross_entropy(outputs, targets)
