"""Tables and their lookups: the Table handle and create_table (table), the
lookups (lookup), the fused ops of many tables (fused), admission and
eviction policies and clocks (features), row initializers (initializers),
and rows stored smaller read back as float32 (stored_rows).
"""
