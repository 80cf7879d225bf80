"""The `graphmod` command line (see graphmod.cli.main): diff, rewrite --dry-run, inspect."""
from graphmod.cli.main import main, run

__all__ = ["main", "run"]
