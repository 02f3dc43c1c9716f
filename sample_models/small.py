"""Small models that each show one problem: BatchNorm + in-place ReLU, frozen adapters, a split block."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class ConvNet(nn.Module):
    """Images (B, 3, 16, 16) -> class logits (B, 10).

    ``relu1`` runs in place on ``conv1``'s output, and ``relu2`` in place on ``bn2``'s
    output: a hook that keeps those outputs by reference sees them overwritten.
    """

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, kernel_size=3, padding=1)    # 8*3*3*3 + 8 = 224
        self.relu1 = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(8, 16, kernel_size=3, padding=1)   # 16*8*3*3 + 16 = 1168
        self.bn2 = nn.BatchNorm2d(16)                             # 32 params, 33 buffer elements
        self.relu2 = nn.ReLU(inplace=True)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, num_classes)                      # 16*10 + 10 = 170

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu1(self.conv1(x))           # (B, 8, 16, 16)
        x = self.relu2(self.bn2(self.conv2(x)))  # (B, 16, 16, 16)
        x = self.pool(x).flatten(1)              # (B, 16)
        return self.fc(x)                        # (B, 10)


class LoRALinear(nn.Module):
    """A frozen Linear plus a trainable low-rank update: y = base(x) + B(A(x))."""

    def __init__(self, d_in: int, d_out: int, rank: int = 2) -> None:
        super().__init__()
        self.base = nn.Linear(d_in, d_out)
        self.base.requires_grad_(False)
        self.lora_A = nn.Linear(d_in, rank, bias=False)
        self.lora_B = nn.Linear(rank, d_out, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.lora_B(self.lora_A(x))


class AdapterMLP(nn.Module):
    """Features (B, 8) -> (B, 4); frozen and trainable parameters interleave.

    parameters() order: layers.0.base.weight (frozen, 128), .base.bias (frozen, 16),
    .lora_A.weight (trainable, 16), .lora_B.weight (trainable, 32), then layers.1, layers.2.
    """

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([LoRALinear(8, 16), LoRALinear(16, 16), LoRALinear(16, 4)])
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = self.act(x)
        return x


class ScaledBlock(nn.Module):
    """Owns two buffers directly (``scale`` and ``pos_table``) beside three Linear children.

    Sizes in float32: each Linear(64, 64) is 4160 elements = 16640 bytes;
    scale is 64 elements = 256 bytes; pos_table is 16*64 = 1024 elements = 4096 bytes.
    """

    def __init__(self, dim: int = 64, positions: int = 16) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, dim)
        self.fc2 = nn.Linear(dim, dim)
        self.fc3 = nn.Linear(dim, dim)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, dim))
        self.register_buffer(
            "pos_table", torch.randn(positions, dim, generator=torch.Generator().manual_seed(1))
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        T = x.size(1)
        x = x + self.pos_table[:T]  # (B, T, C)
        x = F.gelu(self.fc1(x))
        x = F.gelu(self.fc2(x))
        return self.fc3(x) * self.scale


class SplitBlockNet(nn.Module):
    """Sequences (B, T, 64) -> (B, T, 8) through an embedding Linear, a ScaledBlock and a head."""

    def __init__(self, dim: int = 64) -> None:
        super().__init__()
        self.embed = nn.Linear(dim, dim)  # 4160 elements
        self.block = ScaledBlock(dim)
        self.head = nn.Linear(dim, 8)     # 64*8 + 8 = 520 elements

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(self.embed(x)))
