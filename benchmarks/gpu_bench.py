"""Every row of the GPU performance table in one run: captures, gradient norms, D2H bandwidth.

    python benchmarks/gpu_bench.py                  # on cuda:0, full-size models (an H200 fits them)
    python benchmarks/gpu_bench.py --device cpu     # a dry run on tiny models (CI runs it)

Rows (each a median of paired ratios: every repeat runs every variant once, in a rotating
order, and divides by the plain forward pass, or the flat norm, of the same repeat):

1. capture every module of gpt2-small (8 x 256), copies kept on the GPU: ``capture_activations``
   next to hand-written clone hooks and no-op hooks. Goal <= 1.10x.
2. the same with copies stored on the CPU: next to ``.to("cpu")`` in each hook, and the floor
   max(forward, captured bytes / measured D2H bandwidth). Goal <= 2.3x.
3. capture every module of a Llama-shaped 3.2B model in bf16 (1 x 512, 371 modules) from a
   transformers config, copies on the GPU: next to clone hooks and bare references. Goal <= 1.25x.
4. gradient norms by parameter and by module on gpt2-small: ``gradient_report`` (both tables, one
   pass) and two ``gradient_norms`` calls, next to one flat-vector norm and ``_foreach_norm``.
   Goal <= 1.0x the flat-vector norm.

It also prints the captured bytes and the measured device-to-host bandwidth (pinned memory).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from _hooks import hooked  # noqa: E402

from inspector.capture import capture_activations  # noqa: E402
from inspector.offsets import gradient_norms, gradient_report  # noqa: E402
from sample_models import GPT2_SMALL  # noqa: E402
from sample_models.gpt import GPT, GPTConfig  # noqa: E402

GOALS = {"gpt2-gpu": 1.10, "gpt2-cpu": 2.3, "llama-gpu": 1.25, "norms": 1.0}
GPU = [False]  # set by main: verdicts are printed only for a run on a GPU


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def paired(variants: dict[str, Callable[[], object]], base: str, repeats: int,
           device: torch.device) -> dict[str, tuple[float, float]]:
    """name -> (median seconds, median ratio to ``base`` of the same repeat)."""
    names = list(variants)
    times: dict[str, list[float]] = {n: [] for n in names}
    for name in names:  # warm-up
        variants[name]()
    sync(device)
    for i in range(repeats):
        for name in names[i % len(names):] + names[:i % len(names)]:
            gc.collect()
            sync(device)
            t = time.perf_counter()
            result = variants[name]()
            sync(device)
            times[name].append(time.perf_counter() - t)
            del result
    return {
        n: (
            statistics.median(times[n]),
            statistics.median(t / b for t, b in zip(times[n], times[base], strict=True)),
        )
        for n in names
    }


def d2h_bandwidth(device: torch.device, nbytes: int) -> float:
    """Bytes per second of one device-to-host copy into pinned memory (median of 5)."""
    if device.type != "cuda":
        return float("nan")
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    times = []
    for _ in range(6):
        sync(device)
        t = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        sync(device)
        times.append(time.perf_counter() - t)
    return nbytes / statistics.median(times[1:])


def table(title: str, rows: dict[str, tuple[float, float]], goal_row: str, goal: float) -> float:
    """Print the rows; the goal is judged only on a GPU (a CPU dry run only shows that it runs)."""
    print(f"== {title}")
    for name, (secs, ratio) in rows.items():
        mark = ""
        if name == goal_row:
            mark = f"   goal <= {goal:.2f}x" + (
                f": {'met' if ratio <= goal else 'MISSED'}" if GPU[0] else " (judged on a GPU)"
            )
        print(f"   {name:<34}{secs * 1e3:>10.2f} ms{ratio:>8.2f}x{mark}")
    return rows[goal_row][1]


def gpt2_rows(
    device: torch.device, cfg: GPTConfig, batch: tuple[int, int], repeats: int, bandwidth: float
) -> None:
    torch.manual_seed(0)
    model = GPT(cfg).to(device).eval()
    x = torch.randint(0, cfg.vocab_size, batch, device=device)
    with torch.inference_mode():
        cap = capture_activations(model, x, store_on=device)
        captured = cap.total_bytes
        del cap
        on_device = paired({
            "plain forward": lambda: model(x),
            "capture_activations (on device)": lambda: capture_activations(model, x, store_on=device),
            "clone hooks": lambda: hooked(model, lambda: model(x), lambda t: t.detach().clone()),
            "no-op hooks": lambda: hooked(model, lambda: model(x), None),
        }, "plain forward", repeats, device)
        on_cpu = paired(
            {
                "plain forward": lambda: model(x),
                "capture_activations (to cpu)": lambda: capture_activations(model, x, store_on="cpu"),
                ".to('cpu') in each hook": lambda: hooked(
                    model, lambda: model(x), lambda t: t.detach().to("cpu")
                ),
            },
            "plain forward",
            repeats,
            device,
        )
    label = f"gpt2 ({cfg.n_layer} layers, width {cfg.n_embd}) {batch[0]}x{batch[1]}"
    print(f"captured bytes, every module of {label}: {captured / 2**20:.1f} MiB")
    table(f"capture every module, {label}, copies on {device}", on_device,
          "capture_activations (on device)", GOALS["gpt2-gpu"])
    table(f"capture every module, {label}, copies on the CPU", on_cpu,
          "capture_activations (to cpu)", GOALS["gpt2-cpu"])
    if bandwidth == bandwidth:  # not NaN: a GPU
        forward = on_cpu["plain forward"][0]
        floor = max(forward, captured / bandwidth) / forward
        print(
            f"   floor: max(forward, {captured / 2**20:.0f} MiB at {bandwidth / 1e9:.1f} GB/s) = {floor:.2f}x"
        )


def llama_rows(device: torch.device, full: bool, repeats: int) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    if full:  # Llama-3.2-3B shapes: 28 layers, width 3072
        config = LlamaConfig(
            vocab_size=128256,
            hidden_size=3072,
            intermediate_size=8192,
            num_hidden_layers=28,
            num_attention_heads=24,
            num_key_value_heads=8,
            max_position_embeddings=2048,
            tie_word_embeddings=True,
        )
        dtype, tokens = torch.bfloat16, 512
    else:
        config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
        dtype, tokens = torch.float32, 16
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(dtype).eval()
    x = {"input_ids": torch.randint(0, config.vocab_size, (1, tokens), device=device), "use_cache": False}
    modules = sum(1 for _ in model.named_modules())
    params = sum(p.numel() for p in model.parameters())
    with torch.inference_mode():
        rows = paired({
            "plain forward": lambda: model(**x),
            "capture_activations (on device)": lambda: capture_activations(model, x, store_on=device),
            "clone hooks": lambda: hooked(model, lambda: model(**x), lambda t: t.detach().clone()),
            "bare references": lambda: hooked(model, lambda: model(**x), lambda t: t),
        }, "plain forward", repeats, device)
    table(
        f"capture every module, Llama-shaped {params / 1e9:.2f}B {str(dtype)[6:]} 1x{tokens} "
        f"({modules} modules), copies on {device}",
        rows,
        "capture_activations (on device)",
        GOALS["llama-gpu"],
    )


def norm_rows(device: torch.device, cfg: GPTConfig, repeats: int) -> None:
    torch.manual_seed(0)
    model = GPT(cfg).to(device)
    x = torch.randint(0, cfg.vocab_size, (2, min(128, cfg.block_size)), device=device)
    out = model(x)
    logits = out[0] if isinstance(out, tuple) else out
    logits.float().pow(2).mean().backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]

    def flat() -> float:
        return float(torch.linalg.vector_norm(torch.cat([g.reshape(-1) for g in grads])))

    def both() -> object:
        gradient_norms(model, by="parameter")
        return gradient_norms(model, by="module")

    rows = paired(
        {
            "flat-vector norm": flat,
            "vector_norm(_foreach_norm)": lambda: float(
                torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
            ),
            "gradient_report (both tables)": lambda: gradient_report(model),
            "gradient_norms by parameter+module": both,
        },
        "flat-vector norm",
        repeats,
        device,
    )
    table(f"gradient norms by parameter and by module, gpt2 ({cfg.n_layer} layers, width {cfg.n_embd}), "
          f"{len(grads)} gradients on {device}", rows, "gradient_report (both tables)", GOALS["norms"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--repeats", type=int, default=None)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device here (use --device cpu for a dry run on tiny models)")
        return 0
    full = device.type == "cuda"
    GPU[0] = full
    repeats = args.repeats or (9 if full else 2)
    where = torch.cuda.get_device_name(device) if full else "CPU (dry run, tiny models: no GPU figures)"
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {where}, torch {torch.__version__}")
    bandwidth = d2h_bandwidth(device, 256 << 20)
    if full:
        print(f"device-to-host bandwidth, pinned: {bandwidth / 1e9:.1f} GB/s")
    gpt2 = GPT2_SMALL if full else GPTConfig(vocab_size=64, block_size=32, n_layer=2, n_head=2, n_embd=32)
    gpt2_rows(device, gpt2, (8, 256) if full else (2, 16), repeats, bandwidth)
    llama_rows(device, full, repeats)
    norm_rows(device, gpt2, repeats)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
