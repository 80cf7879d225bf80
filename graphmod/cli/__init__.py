"""The `graphmod` command line's work: diff, rewrite --dry-run, inspect, ckpt,
export. Its front (arguments, --help, errors) is the top-level module
graphmod_cli, which answers without importing TensorFlow."""
