"""The bug zoo: small real models and real training loops, healthy and with planted bugs, run
under :func:`inspector.watch` and its integrations; the benchmark the watch's findings are judged by.

Modules: ``core``: a case, its context, the matching and stated-cause rules; ``models``: the tiny
models and their seeded data; ``models_lib``: models built with transformers' MoE and ResNet
classes, peft, distillation and curricula; ``loops``: the plain PyTorch loops and where a bug is
planted; ``cases_plain``, ``cases_stacks`` and ``cases_recipes``: the cases (plain loops; HF
Trainer, Lightning, accelerate; recipes from real libraries); ``runner``: runs and judges a case;
``baselines``: the same bugs under other tools; ``table``: the tables, figures and the goals line.
Run it with ``python -m benchmarks.bugzoo`` (``--help``) or ``make zoo``.
"""
