"""Rewrite rules of graphmod (installed as graphmod.rewrite_rules), one per module."""
