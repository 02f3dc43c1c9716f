"""Sample models, each showing one problem the inspector finds.

The registry ``SAMPLES`` is shared by the dashboard, the labs, the command line and
the tests. Each :class:`Sample` builds a fresh model; nothing heavy happens at import.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from . import fsdp
from .gpt import GPT, GPTConfig, example_tokens, next_token_loss
from .llama import Llama, LlamaConfig
from .small import AdapterMLP, ConvNet, SplitBlockNet


@dataclass(frozen=True)
class Sample:
    """A named model with example inputs and a loss."""

    name: str
    description: str
    build_fn: Callable[[], nn.Module]
    inputs_fn: Callable[[int], Any]
    loss_fn: Callable[[Any, Any], torch.Tensor] | None = None
    meta_only: bool = False

    def build(self) -> nn.Module:
        """A fresh model (on the meta device for structure-only samples)."""
        if self.meta_only:
            with torch.device("meta"):
                return self.build_fn()
        return self.build_fn()

    def example_inputs(self, batch_size: int = 2) -> Any:
        """Deterministic inputs for ``forward`` (a tensor, a tuple or a dict of kwargs)."""
        return self.inputs_fn(batch_size)

    def loss(self, outputs: Any, inputs: Any) -> torch.Tensor:
        if self.loss_fn is None:
            raise ValueError(f"sample {self.name!r} defines no loss")
        return self.loss_fn(outputs, inputs)


def _seeded(build: Callable[[], nn.Module]) -> Callable[[], nn.Module]:
    def fn() -> nn.Module:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            return build()
    return fn


TINY_GPT2 = GPTConfig(vocab_size=32, block_size=16, n_layer=1, n_head=2, n_embd=16)
GPT2_SMALL = GPTConfig(vocab_size=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768)


def _images(batch_size: int) -> torch.Tensor:
    return torch.randn(batch_size, 3, 16, 16, generator=torch.Generator().manual_seed(0))


def _class_loss(outputs: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
    targets = torch.arange(outputs.size(0), device=outputs.device) % outputs.size(1)
    return F.cross_entropy(outputs, targets)


def _regression_loss(outputs: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
    return outputs.pow(2).mean()


SAMPLES: dict[str, Sample] = {s.name: s for s in [
    Sample(
        "tiny-gpt2",
        "A one-layer GPT-2 (vocab 32, 16 positions, width 16, 2 heads) whose output head "
        "lm_head.weight is tied to the token embedding transformer.wte.weight, with a causal-mask "
        "buffer. It has 4080 unique parameter elements, 4592 if the tie is counted twice: the "
        "number to watch when a conversion splits the tie.",
        _seeded(lambda: GPT(TINY_GPT2)),
        lambda b: example_tokens(TINY_GPT2, b),
        next_token_loss,
    ),
    Sample(
        "gpt2-small",
        "The same GPT-2 code at full GPT-2 small size (12 layers, width 768, vocab 50257, 1024 "
        "positions) with random weights: about 124M parameters, for scale and speed.",
        _seeded(lambda: GPT(GPT2_SMALL)),
        lambda b: example_tokens(GPT2_SMALL, b, seq_len=128),
        next_token_loss,
    ),
    Sample(
        "cnn-bn",
        "A small conv net with BatchNorm (running mean, running var and num_batches_tracked "
        "buffers) and ReLU(inplace=True) after a convolution and after the BatchNorm, so a hook "
        "that keeps outputs by reference records values the ReLU later overwrote.",
        _seeded(ConvNet),
        _images,
        _class_loss,
    ),
    Sample(
        "frozen-adapter",
        "A frozen three-layer MLP with small trainable low-rank (LoRA) adapters: frozen and "
        "trainable parameters interleave, so a flat vector of trainable parameters only has "
        "different offsets from parameters_to_vector(model.parameters()).",
        _seeded(AdapterMLP),
        lambda b: torch.randn(b, 8, generator=torch.Generator().manual_seed(0)),
        _regression_loss,
    ),
    Sample(
        "split-block",
        "A block that owns two buffers directly (a scale vector and a position table) beside "
        "three Linear children. With a small per-device budget the block is split across "
        "devices and accelerate's infer_auto_device_map leaves both buffers out of the map.",
        _seeded(SplitBlockNet),
        lambda b: torch.randn(b, 16, 64, generator=torch.Generator().manual_seed(0)),
        _regression_loss,
    ),
    Sample(
        "fsdp-mlp",
        "A residual MLP laid out for FSDP2 (a stem, two pre-norm blocks that are the fully_shard "
        "units, a head; 18,282 parameters, every sharded dimension even) with a replicated buffer "
        "scale. The same model as sample_models/fsdp.py:build, which torchrun -m inspector "
        "distributed shards; here it runs in one process.",
        _seeded(fsdp.FSDPNet),
        fsdp.example_inputs,
        fsdp.loss,
    ),
    Sample(
        "llama-70b-meta",
        "A Llama-shaped decoder at 70B scale (hidden 8192, 80 layers, intermediate 28672, 64 "
        "heads, 8 KV heads, vocab 32000, RMSNorm, rotary inv_freq buffer) built on the meta "
        "device: the full structure with no memory, for planning device maps and offsets.",
        lambda: Llama(LlamaConfig()),
        lambda b: torch.zeros(b, 8, dtype=torch.long),
        next_token_loss,
        meta_only=True,
    ),
]}

DEFAULT_SAMPLE = "tiny-gpt2"


def get_sample(name: str) -> Sample:
    """The sample called ``name``; a KeyError lists the known ones."""
    try:
        return SAMPLES[name]
    except KeyError:
        raise KeyError(f"unknown sample {name!r}; known samples: {', '.join(SAMPLES)}") from None


__all__ = [
    "SAMPLES",
    "DEFAULT_SAMPLE",
    "TINY_GPT2",
    "GPT2_SMALL",
    "Sample",
    "get_sample",
    "GPT",
    "GPTConfig",
    "Llama",
    "LlamaConfig",
    "ConvNet",
    "AdapterMLP",
    "SplitBlockNet",
]
