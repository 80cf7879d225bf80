"""Rule: converted variables and their slots leave Horovod's broadcast.

hvd.BroadcastGlobalVariablesHook (and hvd.broadcast_global_variables) makes
every global variable rank 0's when the session starts: per variable, an
assign of a HorovodBroadcast of its value, all grouped in one op. Listed
before GraphModifierHook, the hook's begin() has built them by the time the
rewrite runs, and they would read variables nothing initializes any more.
This rule takes the assigns of converted variables and of their optimizer
slots out of what the group waits for, so the broadcast skips them on every
rank alike. Tables need no broadcast: a key's row is made by its owner from
(key, seed), the same whichever rank asks. Listed after GraphModifierHook,
the broadcast never sees them (saver_swap takes them out of the global
variables). Refuses nothing.
"""
import tensorflow as tf

from graphmod.rewrite.rule import Context

NAME = "horovod_broadcast"


def _assigns(index, v: tf.Variable):
    """v's broadcast assigns and the reads waiting for them."""
    handle = v.op.outputs[0]
    for op in index.consumers(handle):
        if op.type in ("AssignVariableOp", "Assign") and len(op.inputs) == 2 and \
                op.inputs[0] is handle and op.inputs[1].op.type == "HorovodBroadcast":
            yield op
            yield from (c for c in index.control_consumers(op)
                        if c.type == "ReadVariableOp" and c.inputs[0] is handle)


def rewrite(rw, conversions, context: Context) -> None:
    del context
    with rw.rule(NAME):
        for c in conversions:
            slots = c.update.slots if c.update is not None else []
            for v in [c.variable] + slots:
                for op in list(_assigns(rw.index, v)):
                    rw.replace_control_input(op, None)
