"""Subcommands of ``python -m inspector``; one module per command."""
