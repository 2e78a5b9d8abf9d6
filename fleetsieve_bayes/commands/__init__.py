"""CLI subcommands: one module each, with ``register(subparsers)``."""

__all__: list[str] = []
