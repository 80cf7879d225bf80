"""`python -m graphmod COMMAND ...`: the graphmod command line (graphmod.cli)."""
from graphmod_cli import run

run()
