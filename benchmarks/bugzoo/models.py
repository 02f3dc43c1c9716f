"""The zoo's small real models and their synthetic data (seeded), each a :class:`Task`: the model,
batch ``i``, and the loss of a batch. Hugging Face models are built from tiny configs (no download)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

VOCAB, SEQ = 64, 16


@dataclass
class Task:
    model: nn.Module
    batch: Callable[[int], dict[str, torch.Tensor]]
    loss: Callable[[nn.Module, dict[str, torch.Tensor]], torch.Tensor]
    lr: float = 1e-3


def _batches(make: Callable[[torch.Generator], dict[str, torch.Tensor]], seed: int, count: int = 16):
    g = torch.Generator().manual_seed(seed + 1)
    fixed = [make(g) for _ in range(count)]
    return lambda i: {k: v.clone() for k, v in fixed[i % count].items()}


def _hf_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return model(**batch).loss


class BackwardNaN(torch.autograd.Function):
    """Identity forward; its backward returns NaN when ``poison`` is set (a broken custom op)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, poison: bool) -> torch.Tensor:
        ctx.poison = poison
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return (grad * float("nan") if ctx.poison else grad), None


class Gate(nn.Module):
    """A custom op inside a named module: a learned scale through :class:`BackwardNaN`."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(width))
        self.poison = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return BackwardNaN.apply(x, self.poison) * self.scale


class MLP(nn.Module):
    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.fc1, self.drop, self.fc2 = nn.Linear(16, width), nn.Dropout(0.1), nn.Linear(width, width)
        self.gate, self.fc3 = Gate(width), nn.Linear(width, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.drop(torch.relu(self.fc1(x)))
        return self.fc3(self.gate(torch.relu(self.fc2(h))))


def mlp(seed: int = 0) -> Task:
    torch.manual_seed(seed)
    model, teacher = MLP(), nn.Linear(16, 4)

    def make(g: torch.Generator) -> dict[str, torch.Tensor]:
        x = torch.randn(32, 16, generator=g)
        return {"x": x, "y": teacher(x).argmax(-1).detach()}

    return Task(model, _batches(make, seed),
                lambda m, b: nn.functional.cross_entropy(m(b["x"]), b["y"]), lr=3e-3)


class CNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.conv2, self.bn2 = nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.bn1(self.conv1(x)))
        h = torch.relu(self.bn2(self.conv2(h)))
        return self.head(h.mean((2, 3)))


def cnn(seed: int = 0) -> Task:
    torch.manual_seed(seed)
    model = CNN()

    def make(g: torch.Generator) -> dict[str, torch.Tensor]:
        y = torch.randint(0, 4, (16,), generator=g)
        x = torch.randn(16, 3, 8, 8, generator=g) + y.view(-1, 1, 1, 1).float() * 0.5
        return {"x": x, "y": y}

    return Task(model, _batches(make, seed),
                lambda m, b: nn.functional.cross_entropy(m(b["x"]), b["y"]), lr=3e-3)


def _tokens(g: torch.Generator, batch: int = 4) -> torch.Tensor:
    start = torch.randint(0, VOCAB, (batch, 1), generator=g)
    return (start + torch.arange(SEQ) * torch.randint(1, 4, (batch, 1), generator=g)) % VOCAB


def gpt2(seed: int = 0) -> Task:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=SEQ * 2, n_embd=32, n_layer=2, n_head=2,
                                            bos_token_id=0, eos_token_id=0))

    def make(g: torch.Generator) -> dict[str, torch.Tensor]:
        ids = _tokens(g)
        return {"input_ids": ids, "labels": ids}

    return Task(model, _batches(make, seed), _hf_loss, lr=1e-3)


def llama(seed: int = 0) -> Task:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                                         max_position_embeddings=SEQ * 2))

    def make(g: torch.Generator) -> dict[str, torch.Tensor]:
        ids = _tokens(g)
        return {"input_ids": ids, "labels": ids}

    return Task(model, _batches(make, seed), _hf_loss, lr=1e-3)


def bert(seed: int = 0) -> Task:
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(seed)
    model = BertForMaskedLM(BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                       num_attention_heads=2, intermediate_size=64,
                                       max_position_embeddings=SEQ * 2))

    def make(g: torch.Generator) -> dict[str, torch.Tensor]:
        ids = _tokens(g)
        mask = torch.rand(ids.shape, generator=g) < 0.2
        mask[:, 0] = True
        return {"input_ids": ids.masked_fill(mask, 3), "labels": ids.masked_fill(~mask, -100)}

    return Task(model, _batches(make, seed), _hf_loss, lr=1e-3)


def vit(seed: int = 0) -> Task:
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(seed)
    model = ViTForImageClassification(ViTConfig(image_size=8, patch_size=4, num_channels=3, hidden_size=32,
                                                num_hidden_layers=2, num_attention_heads=2,
                                                intermediate_size=64, num_labels=4))

    def make(g: torch.Generator) -> dict[str, torch.Tensor]:
        y = torch.randint(0, 4, (16,), generator=g)
        x = torch.randn(16, 3, 8, 8, generator=g) + y.view(-1, 1, 1, 1).float() * 0.5
        return {"pixel_values": x, "labels": y}

    return Task(model, _batches(make, seed), _hf_loss, lr=1e-3)


class LSTMLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed, self.lstm, self.head = nn.Embedding(VOCAB, 16), nn.LSTM(16, 32, batch_first=True), \
            nn.Linear(32, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.lstm(self.embed(ids))[0])


def lstm(seed: int = 0) -> Task:
    torch.manual_seed(seed)
    model = LSTMLM()

    def make(g: torch.Generator) -> dict[str, torch.Tensor]:
        return {"ids": _tokens(g)}

    def loss(m: nn.Module, b: dict[str, torch.Tensor]) -> torch.Tensor:
        logits = m(b["ids"][:, :-1])
        return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), b["ids"][:, 1:].reshape(-1))

    return Task(model, _batches(make, seed), loss, lr=3e-3)


class GAN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gen = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))
        self.disc = nn.Sequential(nn.Linear(2, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))


def gan_data(seed: int = 0) -> Callable[[int], dict[str, torch.Tensor]]:
    def make(g: torch.Generator) -> dict[str, torch.Tensor]:
        angle = torch.rand(32, generator=g) * 6.283
        real = torch.stack([angle.cos(), angle.sin()], 1) + 0.05 * torch.randn(32, 2, generator=g)
        return {"real": real, "z": torch.randn(32, 8, generator=g)}

    return _batches(make, seed)


MODELS: dict[str, Callable[[int], Task]] = {"mlp": mlp, "cnn": cnn, "gpt2": gpt2, "llama": llama,
                                            "bert": bert, "vit": vit, "lstm": lstm}
