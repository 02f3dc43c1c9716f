"""The zoo's models built with the libraries people train with, from tiny configs (no download):
transformers' mixture-of-experts classes (Switch Transformers' top-1 router with one module per
expert, Mixtral and OLMoE with their experts fused in one tensor), transformers' ResNet (its
BatchNorm kept in eval mode and frozen, or swapped for the DETR backbone's
``FrozenBatchNorm2d``), LoRA adapters from peft, distillation from a frozen teacher, and a
curriculum that switches its data half-way. Each is a :class:`~.models.Task`, registered in
:data:`~.models.MODELS` under its name.

torchvision and timm are not among them: the torchvision builds published for torch 2.13 link
against the CUDA torch libraries, so with the CPU build of torch ``import torchvision`` fails, and
timm imports torchvision when it is imported."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .models import MLP, MODELS, SEQ, VOCAB, Task, _batches, _hf_loss, _tokens


def _lm_batches(seed: int, batch: int = 4) -> Any:
    def make(g: torch.Generator) -> dict[str, torch.Tensor]:
        ids = _tokens(g, batch)
        return {"input_ids": ids, "labels": ids}

    return _batches(make, seed)


# -- mixture of experts ------------------------------------------------------------------------
def switch(seed: int = 0) -> Task:
    """Switch Transformers (top-1 routing, 4 experts, one module each) on 2 x 8 tokens a step:
    some expert gets no token for a step or two, often (measured: each expert idle on 14-95% of
    200 steps)."""
    from transformers import SwitchTransformersConfig, SwitchTransformersForConditionalGeneration

    torch.manual_seed(seed)
    model = SwitchTransformersForConditionalGeneration(
        SwitchTransformersConfig(
            vocab_size=VOCAB,
            d_model=32,
            d_kv=16,
            d_ff=64,
            num_layers=2,
            num_decoder_layers=2,
            num_heads=2,
            num_experts=4,
            expert_capacity=64,
            num_sparse_encoder_layers=1,
            num_sparse_decoder_layers=1,
            decoder_start_token_id=0,
            pad_token_id=0,
            eos_token_id=1,
            router_jitter_noise=0.1,
        )
    )

    def make(g: torch.Generator) -> dict[str, torch.Tensor]:
        ids = 2 + _tokens(g, 2)[:, :8] % (VOCAB - 2)
        return {"input_ids": ids, "labels": ids}

    return Task(model, _batches(make, seed), _hf_loss, lr=1e-3)


def _moe_config(cls: Any, **extra: Any) -> Any:
    return cls(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=SEQ * 2,
        num_experts_per_tok=1,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=0,
        **extra,
    )


def mixtral(seed: int = 0) -> Task:
    """Mixtral with 4 experts, top-1 routing and router jitter (its experts fused in one tensor;
    measured: some expert gets no token on 14 of 200 steps)."""
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(seed)
    model = MixtralForCausalLM(_moe_config(MixtralConfig, num_local_experts=4, router_jitter_noise=0.1))
    return Task(model, _lm_batches(seed, 2), _hf_loss, lr=1e-3)


def olmoe(seed: int = 0) -> Task:
    """OLMoE with 4 experts and top-1 routing (some expert idle on 37 of 200 steps)."""
    from transformers import OlmoeConfig, OlmoeForCausalLM

    torch.manual_seed(seed)
    model = OlmoeForCausalLM(_moe_config(OlmoeConfig, num_experts=4))
    return Task(model, _lm_batches(seed, 2), _hf_loss, lr=1e-3)


# -- vision backbones with frozen BatchNorm ----------------------------------------------------
def _images(seed: int, size: int = 16) -> Any:
    def make(g: torch.Generator) -> dict[str, torch.Tensor]:
        y = torch.randint(0, 4, (8,), generator=g)
        x = torch.randn(8, 3, size, size, generator=g) + y.view(-1, 1, 1, 1).float() * 0.5
        return {"pixel_values": x, "labels": y}

    return _batches(make, seed)


def _resnet_model() -> nn.Module:
    from transformers import ResNetConfig, ResNetForImageClassification

    return ResNetForImageClassification(
        ResNetConfig(
            num_channels=3,
            embedding_size=8,
            hidden_sizes=[8, 16],
            depths=[1, 1],
            layer_type="basic",
            num_labels=4,
        )
    )


def resnet(seed: int = 0) -> Task:
    """transformers' ResNet (two stages), every BatchNorm training as usual."""
    torch.manual_seed(seed)
    return Task(_resnet_model(), _images(seed), _hf_loss, lr=1e-3)


class NormEval(nn.Module):
    """The detection/fine-tuning recipe (mmdetection's ``norm_eval=True``): the backbone's
    BatchNorm layers stay in eval mode whatever ``train()`` is called with, their affine
    parameters frozen; the convolutions and the head train."""

    def __init__(self, model: nn.Module, norm_eval: bool = True) -> None:
        super().__init__()
        self.model, self.norm_eval = model, norm_eval
        for m in self.model.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                for p in m.parameters():
                    p.requires_grad_(False)

    def train(self, mode: bool = True) -> NormEval:
        super().train(mode)
        if mode and self.norm_eval:
            for m in self.model.modules():
                if isinstance(m, nn.modules.batchnorm._BatchNorm):
                    m.eval()
        return self

    def forward(self, **batch: Any) -> Any:
        return self.model(**batch)


def resnet_norm_eval(seed: int = 0) -> Task:
    torch.manual_seed(seed)
    return Task(NormEval(_resnet_model()), _images(seed), _hf_loss, lr=1e-3)


def resnet_frozen_bn(seed: int = 0) -> Task:
    """Every BatchNorm2d swapped for transformers' ``DetrFrozenBatchNorm2d`` (DETR's backbone:
    statistics and affine held in buffers, nothing to train)."""
    from transformers.models.detr.modeling_detr import replace_batch_norm

    torch.manual_seed(seed)
    model = _resnet_model()
    replace_batch_norm(model)
    return Task(model, _images(seed), _hf_loss, lr=1e-3)


# -- LoRA (peft) -------------------------------------------------------------------------------
def _lora(model: nn.Module, targets: list[str], **extra: Any) -> nn.Module:
    from peft import LoraConfig, get_peft_model

    return get_peft_model(
        model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.05, target_modules=targets, **extra)
    )


def lora_gpt2(seed: int = 0) -> Task:
    task = MODELS["gpt2"](seed)
    torch.manual_seed(seed)
    task.model = _lora(task.model, ["c_attn", "c_fc"], fan_in_fan_out=True)
    task.lr = 3e-3
    return task


def lora_llama(seed: int = 0) -> Task:
    task = MODELS["llama"](seed)
    torch.manual_seed(seed)
    task.model = _lora(task.model, ["q_proj", "v_proj", "up_proj"])
    task.lr = 3e-3
    return task


def lora_bert(seed: int = 0) -> Task:
    """LoRA on BERT's attention, the MLM head trained in full (``modules_to_save``)."""
    task = MODELS["bert"](seed)
    torch.manual_seed(seed)
    task.model = _lora(task.model, ["query", "value"], modules_to_save=["cls"])
    task.lr = 3e-3
    return task


# -- distillation ------------------------------------------------------------------------------
class Distill(nn.Module):
    """A student trained on the labels and on a frozen teacher's softened outputs; the teacher is
    a submodule (as in most distillation code), in eval mode with ``requires_grad=False``."""

    def __init__(self, student: nn.Module, teacher: nn.Module, temperature: float = 2.0) -> None:
        super().__init__()
        self.student, self.teacher, self.temperature = student, teacher, temperature
        self.teacher.requires_grad_(False)

    def train(self, mode: bool = True) -> Distill:
        super().train(mode)
        self.teacher.eval()
        return self

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        t = self.temperature
        logits = self.student(x)
        with torch.no_grad():
            soft = self.teacher(x)
        kd = (
            nn.functional.kl_div(
                nn.functional.log_softmax(logits / t, -1),
                nn.functional.softmax(soft / t, -1),
                reduction="batchmean",
            )
            * t
            * t
        )
        return 0.5 * kd + 0.5 * nn.functional.cross_entropy(logits, y)


def distill_mlp(seed: int = 0) -> Task:
    base = MODELS["mlp"](seed)
    torch.manual_seed(seed + 100)
    teacher = MLP(64)
    return Task(Distill(base.model, teacher), base.batch, lambda m, b: m(b["x"], b["y"]), lr=base.lr)


class DistillLM(nn.Module):
    """A 2-layer GPT-2 student distilled from a frozen 3-layer GPT-2 teacher (eval mode)."""

    def __init__(self, student: nn.Module, teacher: nn.Module) -> None:
        super().__init__()
        self.student, self.teacher = student, teacher
        self.teacher.requires_grad_(False)

    def train(self, mode: bool = True) -> DistillLM:
        super().train(mode)
        self.teacher.eval()
        return self

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        out = self.student(input_ids=input_ids, labels=labels)
        with torch.no_grad():
            soft = self.teacher(input_ids=input_ids).logits
        kd = (
            nn.functional.kl_div(
                nn.functional.log_softmax(out.logits, -1),
                nn.functional.softmax(soft, -1),
                reduction="batchmean",
            )
            / input_ids.shape[1]
        )
        return 0.5 * out.loss + 0.5 * kd


def distill_gpt2(seed: int = 0) -> Task:
    from transformers import GPT2Config, GPT2LMHeadModel

    base = MODELS["gpt2"](seed)
    torch.manual_seed(seed + 100)
    teacher = GPT2LMHeadModel(
        GPT2Config(
            vocab_size=VOCAB,
            n_positions=SEQ * 2,
            n_embd=32,
            n_layer=3,
            n_head=2,
            bos_token_id=0,
            eos_token_id=0,
        )
    )
    return Task(DistillLM(base.model, teacher), base.batch, lambda m, b: m(**b), lr=base.lr)


# -- a curriculum ------------------------------------------------------------------------------
def curriculum_gpt2(seed: int = 0, switch_at: int = 100) -> Task:
    """Short, easy sequences (step 1 patterns, 8 tokens) until ``switch_at``, then the full task."""
    task = MODELS["gpt2"](seed)
    hard = task.batch

    def easy_make(g: torch.Generator) -> dict[str, torch.Tensor]:
        start = torch.randint(0, VOCAB, (4, 1), generator=g)
        ids = (start + torch.arange(8)) % VOCAB
        return {"input_ids": ids, "labels": ids}

    easy = _batches(easy_make, seed)
    task.batch = lambda i: easy(i) if i < switch_at else hard(i)
    return task


def curriculum_cnn(seed: int = 0, switch_at: int = 100) -> Task:
    """Clean, well separated images until ``switch_at``, then noisier ones (a harder stage)."""
    task = MODELS["cnn"](seed)
    easy = task.batch
    task.batch = lambda i: (
        easy(i)
        if i < switch_at
        else {
            "x": easy(i)["x"] + 0.5 * torch.randn(16, 3, 8, 8, generator=torch.Generator().manual_seed(i)),
            "y": easy(i)["y"],
        }
    )
    return task


LIBRARY_MODELS = {
    "switch": switch,
    "mixtral": mixtral,
    "olmoe": olmoe,
    "resnet": resnet,
    "resnet-norm-eval": resnet_norm_eval,
    "resnet-frozen-bn": resnet_frozen_bn,
    "lora-gpt2": lora_gpt2,
    "lora-llama": lora_llama,
    "lora-bert": lora_bert,
    "distill-mlp": distill_mlp,
    "distill-gpt2": distill_gpt2,
    "curriculum-gpt2": curriculum_gpt2,
    "curriculum-cnn": curriculum_cnn,
}
MODELS.update(LIBRARY_MODELS)
