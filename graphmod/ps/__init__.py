"""Tables split by key over the ps tasks of a parameter-server cluster
(graphmod.ps.tables; the rewrite: rewrite_rules.ps_shards)."""
