"""`bazel run //:graphmod_cli -- COMMAND ...`: the graphmod command line."""
from graphmod.cli.main import run

run()
