"""Checkpoints of tables: graphmod's Saver with adoption of dense checkpoints
(saver), incremental deltas (deltas), warm start from other models
(warm_start) and the SavedModel export (export).
"""
