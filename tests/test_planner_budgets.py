"""The planner never leaves an accelerator emptier than accelerate does, on many budgets.

Devices 0 and 1 need not exist to plan: the models here are built on the meta device or
planned as arithmetic, as the other placement tests do. Bytes are the real sizes of the
tensors (accelerate counts a bool as one bit; its maps are measured here with real sizes).
"""

from __future__ import annotations

import logging
import warnings

import pytest
import torch
from accelerate import infer_auto_device_map
from accelerate.utils import check_device_map

from inspector.inventory import tensor_inventory
from inspector.placement import accelerate_budget, dispatch_plan, plan_device_map
from sample_models import get_sample

MiB = 2**20


@pytest.fixture(autouse=True)
def _quiet():
    logger = logging.getLogger("accelerate")
    level = logger.level
    logger.setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        yield
    logger.setLevel(level)


@pytest.fixture(scope="module")
def gpt2_small_meta():
    with torch.device("meta"):
        return get_sample("gpt2-small").build()


def device_of(device_map, name: str):
    """The device of tensor ``name`` under a map (the longest key that is a prefix of it)."""
    best = None
    for key, dev in device_map.items():
        if key == "" or name == key or name.startswith(key + "."):
            if best is None or len(key) > len(best[0]):
                best = (key, dev)
    return None if best is None else best[1]


def bytes_by_device(model, device_map) -> dict:
    """Real bytes of every parameter and buffer (each tensor once) per device of the map."""
    out: dict = {}
    seen: set[int] = set()
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        if id(t) in seen:
            continue
        seen.add(id(t))
        dev = device_of(device_map, name)
        out[dev] = out.get(dev, 0) + t.numel() * t.element_size()
    return out


def on_accelerators(model, device_map) -> int:
    return sum(n for d, n in bytes_by_device(model, device_map).items() if isinstance(d, int))


def within_budget(model, device_map, budget) -> bool:
    used = bytes_by_device(model, device_map)
    return all(n <= budget[d] for d, n in used.items() if d in budget and d != "disk")


def check_against_accelerate(model, budget) -> tuple[dict, dict]:
    ours = plan_device_map(model, budget)
    no_split = list(getattr(model, "_no_split_modules", None) or [])
    theirs = dict(infer_auto_device_map(model, max_memory=accelerate_budget(budget),
                                        no_split_module_classes=no_split))
    check_device_map(model, ours)
    assert within_budget(model, ours, budget), (budget, ours)
    if within_budget(model, theirs, budget):  # a map over its budget is no bar to clear
        assert on_accelerators(model, ours) >= on_accelerators(model, theirs), (budget, ours, theirs)
    return ours, theirs


def test_gpt2_small_250_mib_puts_the_embedding_the_tied_head_and_blocks_on_gpu_0(gpt2_small_meta):
    model = gpt2_small_meta
    ours, theirs = check_against_accelerate(model, {0: 250 * MiB, "cpu": 8 << 30})
    # wte 147.2 MiB + wpe 3 MiB + two blocks of 28.04 MiB = 206.3 MiB, and a third block
    # (28.04 MiB) is kept free to load back offloaded blocks: 234.3 + 28.04 > 250.
    assert device_of(ours, "transformer.wte.weight") == device_of(ours, "lm_head.weight") == 0
    assert [device_of(ours, f"transformer.h.{i}.attn.c_attn.weight") for i in range(4)] == [
        0,
        0,
        "cpu",
        "cpu",
    ]
    assert on_accelerators(model, ours) == 154389504 + 3145728 + 2 * 29400064
    assert on_accelerators(model, ours) == on_accelerators(model, theirs)


def test_gpt2_small_600_mib_is_all_on_gpu_0(gpt2_small_meta):
    # 486.7 MiB fit in 600: nothing is offloaded, so nothing is reserved
    ours, theirs = check_against_accelerate(gpt2_small_meta, {0: 600 * MiB, "cpu": 8 << 30})
    assert ours == theirs == {"": 0}


@pytest.mark.parametrize("budget", [
    {0: 100 * MiB, 1: 200 * MiB, "cpu": 8 << 30},
    {0: 180 * MiB, 1: 180 * MiB, "cpu": 8 << 30},
    {0: 300 * MiB, 1: 100 * MiB, "cpu": 8 << 30},
    {0: 490 * MiB, "cpu": 8 << 30},
])
def test_gpt2_small_more_budgets(gpt2_small_meta, budget):
    ours, _ = check_against_accelerate(gpt2_small_meta, budget)
    assert device_of(ours, "transformer.wte.weight") == device_of(ours, "lm_head.weight")


def test_split_block_and_llama_over_a_sweep_of_budgets():
    for name in ("split-block", "llama-70b-meta"):
        model = get_sample(name).build()
        total = tensor_inventory(model).module_bytes()[""]
        for share in (0.1, 0.2, 0.3, 0.45, 0.55, 0.6, 0.7, 0.75, 0.85, 0.9, 0.95, 1.02, 1.05, 1.2):
            for second in (False, True):
                budget = {0: int(total * share)}
                if second:
                    budget[1] = int(total * share / 2)
                budget["cpu"] = 3 * total
                check_against_accelerate(model, budget)


@pytest.mark.parametrize("cpu", [30000, 50000, 67000, 80000])
def test_dispatched_outputs_equal_the_model_on_cpu_and_disk_budgets(cpu):
    # split-block holds 72992 bytes: 80000 keeps it all on the cpu; smaller budgets send layers to disk
    model = get_sample("split-block").build()
    x = get_sample("split-block").example_inputs(2)
    with torch.no_grad():
        expected = model(x)
    device_map = plan_device_map(model, {"cpu": cpu, "disk": 1 << 30})
    assert ("disk" in device_map.values()) == (cpu < 72992)
    with dispatch_plan(model, device_map) as d, torch.no_grad():
        assert torch.equal(d.model(x), expected)
