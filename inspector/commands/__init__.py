"""Subcommands of ``python -m inspector``; one module per command.

Modules: ``aliases``: ``python -m inspector aliases SOURCE [--convert NAME]``; ``argtypes``: argparse
types that check every command-line value while it is parsed; ``attribute``; ``capture``: ``python -m
inspector capture SOURCE --modules PATTERN [--json OUT]``; ``checkpoint``: ``python -m inspector
checkpoint PATH``; ``common``: arguments and output helpers shared by the subcommands; ``compare``:
``python -m inspector compare A B``; ``devicemap``; ``distributed``; ``labs``: ``python -m inspector labs
list`` and ``labs collect REPORTS... -o class.csv``; ``offsets``; ``replay``: ``python -m inspector replay RUN
--step N [--model SPEC]``; ``report``; ``serve``:
``model-inspector serve [--port N] [streamlit options]``; ``summary``: ``python -m inspector summary
SOURCE``; ``watch``.
"""
