"""One test file per rewrite rule (graphmod.rewrite_rules): what it matches, builds and refuses."""
