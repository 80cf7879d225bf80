"""graphmod's graph rewriting: the read-only graph view (view), where ids flow
(ids), the gradient an update consumes (gradients), the planner (plan), the
model's saved plan (plan_file), the Rewriter every edit goes through
(rewriter), the rule interface (rule), the validity check (validate), the
report (report) and the one pipeline that runs them (pipeline.rewrite),
called by GraphModifierHook, export_saved_model and the CLI.
"""
