"""SessionRunHooks of graphmod (installed as graphmod.hooks).

Hooks only orchestrate: graph surgery lives in graphmod's rewriter and in
graphmod.rewrite_rules.
"""
