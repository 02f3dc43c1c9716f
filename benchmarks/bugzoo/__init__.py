"""The bug zoo: small real models and real training loops, healthy and with planted bugs, run
under :func:`inspector.watch` and its integrations; the benchmark the watch's findings are judged by.

Modules: ``core``: a case, its context, the matching rule; ``models``: the tiny models and their
seeded data; ``loops``: the plain PyTorch loops and where a bug is planted; ``cases_plain`` and
``cases_stacks``: the cases (plain loops; HF Trainer, Lightning, accelerate); ``runner``: runs and
judges a case; ``baselines``: the same bugs under other tools; ``table``: the tables and figures.
Run it with ``python -m benchmarks.bugzoo`` (``--help``) or ``make zoo``.
"""
