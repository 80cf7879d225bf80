"""`python -m graphmod COMMAND ...`: the graphmod command line (graphmod.cli)."""
from graphmod.cli.main import run

run()
