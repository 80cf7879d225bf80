"""Horovod's combination of a gradient across ranks, read off the graph.

hvd.DistributedOptimizer wraps each gradient in a cond whose true branch
runs the collective and whose false branch (one rank) passes the gradient
on (docs/notes/horovod_0.28.1_facts.md, section 2):
  - IndexedSlices: allgathers of values and indices, the values divided by
    the number of ranks for op=Average (a RealDiv by a constant), not for Sum;
  - dense (sparse_as_dense=True, or a dense gradient): an allreduce whose
    reduce_op says Average (the backend divides) or Sum, with pre/postscale.
With control flow v2 (TF2's default, graph mode too) the cond is a
(Stateless)If op and the collectives live in its branch functions; with v1
they are graph ops between Switch and Merge. `through_collective` walks from
the gradient an update consumes back to the rank's local gradient and says
how the ranks' gradients were combined, so that a table sharded across
ranks can receive exactly that combination at each key's owner.
"""
import dataclasses
from typing import List, Optional, Tuple

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import tensor_util

from graphmod import folding
from graphmod.rewrite.index import strip_identity

_IF = ("If", "StatelessIf")
_AVERAGE, _SUM = 0, 1  # HorovodAllreduce's reduce_op values


@dataclasses.dataclass
class Collective:
    """How Horovod combined one gradient tensor across ranks."""
    combine: str    # "average" or "sum", as the user's DistributedOptimizer says
    factor: float   # the sum over ranks is multiplied by this (1/size for average)
    runs: bool      # the cond takes the collective branch (False on one rank)


def scale_chain(t: tf.Tensor, stop) -> Tuple[tf.Tensor, List[Tuple[tf.Tensor, bool]], str]:
    """(the tensor `stop` accepts, [(scalar, divides)] applied to it on the way
    to t, why not): t must be it times and over rank-0 tensors (the scaling
    clip_by_global_norm, loss-scale and multipliers apply after Horovod's
    collective, which commutes with sending the local gradient instead)."""
    scales = []
    while True:
        t = strip_identity(t)
        if stop(t):
            return t, scales[::-1], ""
        op = t.op
        if op.type == "Mul" and any(x.shape.rank == 0 for x in op.inputs):
            scalar = next(i for i, x in enumerate(op.inputs) if x.shape.rank == 0)
            scales.append((op.inputs[scalar], False))
            t = op.inputs[1 - scalar]
        elif op.type in ("RealDiv", "Div") and op.inputs[1].shape.rank == 0:
            scales.append((op.inputs[1], True))
            t = op.inputs[0]
        else:
            return t, [], f"{op.type} {op.name}"


def is_combined(t: tf.Tensor) -> bool:
    """Whether t is the output of a DistributedOptimizer cond (v2 or v1):
    a cond whose true branch runs a Horovod op."""
    if t.op.type in _IF:
        then_fn = _function(t.op.graph, t.op.get_attr("then_branch").name)
        return then_fn is not None and any(n.op.startswith("Horovod") for n in then_fn.node_def)
    return t.op.type == "Merge" and _v1_branches(t.op) is not None


def through_collective(t: tf.Tensor) -> Tuple[tf.Tensor, Optional[Collective], str]:
    """(local tensor, how the ranks combined it, why it cannot tell) for a
    DistributedOptimizer cond's output t (see is_combined)."""
    if t.op.type in _IF:
        return _through_if(t)
    return _through_merge(t)


# --- control flow v2: the collective inside the If's then_branch function ---

def _function(graph: tf.Graph, name: str):
    fn = graph._get_function(name)  # pylint: disable=protected-access
    if fn is None:
        return None
    return getattr(fn, "cached_definition", None) or fn.definition


def _through_if(t: tf.Tensor):
    op = t.op
    then_fn = _function(op.graph, op.get_attr("then_branch").name)
    else_fn = _function(op.graph, op.get_attr("else_branch").name)
    if then_fn is None or else_fn is None:
        return t, None, f"cannot read the branches of {op.name}"
    k = t.value_index
    nodes = {n.name: n for n in then_fn.node_def}
    args = [a.name for a in then_fn.signature.input_arg]
    node, _ = _fn_source(then_fn.ret[then_fn.signature.output_arg[k].name], nodes)
    factor, combine = 1.0, None
    if node is not None and node.op == "RealDiv":
        divisor, _ = _fn_source(node.input[1], nodes)
        size = _fn_constant(divisor, nodes)
        if size is None:
            return t, None, f"{op.name} divides its gradient by something not constant"
        factor, combine = 1.0 / size, "average"
        node, _ = _fn_source(node.input[0], nodes)
    if node is None or node.op not in ("HorovodAllgather", "HorovodAllreduce"):
        return t, None, (f"{op.name} output {k} is not one Horovod allgather or allreduce "
                         f"({node.op if node is not None else 'an argument'})")
    if node.attr["process_set_id"].i != 0:
        return t, None, f"{op.name} combines over a Horovod process set, which is not built"
    if node.op == "HorovodAllreduce":
        if combine is not None:
            return t, None, f"{op.name} divides an allreduce's result"
        combine, factor, why = _allreduce_combine(node.attr["reduce_op"].i,
                                                  node.attr["prescale_factor"].f,
                                                  node.attr["postscale_factor"].f)
        if why:
            return t, None, f"{op.name}: {why}"
    elif combine is None:
        combine = "sum"
    source, arg = _fn_source(node.input[0], nodes)
    if source is not None or arg not in args:
        return t, None, f"{op.name}'s collective does not take a branch argument"
    j = args.index(arg)
    # The else branch (one rank) must pass argument j on as output k.
    _, passed = _fn_source(else_fn.ret[else_fn.signature.output_arg[k].name],
                           {n.name: n for n in else_fn.node_def})
    else_args = [a.name for a in else_fn.signature.input_arg]
    if passed not in else_args or else_args.index(passed) != j:
        return t, None, f"{op.name}'s one-rank branch does not pass its gradient on"
    runs = folding.scalar(op.inputs[0])
    if runs is None:
        return t, None, f"{op.name}'s condition is not a constant (elastic Horovod)"
    return op.inputs[1 + j], Collective(combine, factor, bool(runs)), ""


def _fn_source(ref: str, nodes):
    """(node, None) a function tensor reference comes from, through Identity
    nodes, or (None, argument name)."""
    while True:
        name = ref.split(":")[0]
        node = nodes.get(name)
        if node is None:
            return None, name
        if node.op != "Identity":
            return node, None
        ref = node.input[0]


def _fn_constant(node, nodes) -> Optional[float]:
    while node is not None and node.op == "Cast":
        node, _ = _fn_source(node.input[0], nodes)
    if node is None or node.op != "Const":
        return None
    value = tensor_util.MakeNdarray(node.attr["value"].tensor)
    return float(value) if np.ndim(value) == 0 else None


def _allreduce_combine(reduce_op: int, prescale: float, postscale: float):
    import horovod.tensorflow as hvd  # pylint: disable=import-outside-toplevel
    scale = (prescale or 1.0) * (postscale or 1.0)
    if reduce_op == _AVERAGE:
        return "average", scale / hvd.size(), ""
    if reduce_op == _SUM:
        return "sum", scale, ""
    return None, 0.0, f"its allreduce's reduce_op {reduce_op} is neither Average nor Sum"


# --- control flow v1: Switch -> collective -> Merge ---

def _v1_branches(merge: tf.Operation):
    """(local input of the false branch, true branch's result) of a Merge
    whose one input is a Switch's false output and the other reaches a
    Horovod collective, or None."""
    if len(merge.inputs) != 2:
        return None
    false = [x for x in merge.inputs if strip_identity(x).op.type == "Switch" and
             strip_identity(x).value_index == 0]
    true = [x for x in merge.inputs if x not in false]
    if len(false) != 1 or len(true) != 1:
        return None
    node = strip_identity(true[0]).op
    if node.type == "RealDiv":
        node = strip_identity(node.inputs[0]).op
    if node.type not in ("HorovodAllgather", "HorovodAllreduce"):
        return None
    return strip_identity(false[0]).op.inputs[0], strip_identity(true[0])


def _through_merge(t: tf.Tensor):
    op = t.op
    local, result = _v1_branches(op)
    factor, combine = 1.0, None
    if result.op.type == "RealDiv":
        size = folding.scalar(result.op.inputs[1])
        if size is None:
            return t, None, f"{op.name} divides its gradient by something not constant"
        factor, combine = 1.0 / size, "average"
        result = strip_identity(result.op.inputs[0])
    node = result.op
    if node.get_attr("process_set_id") != 0:
        return t, None, f"{op.name} combines over a Horovod process set, which is not built"
    if node.type == "HorovodAllreduce":
        if combine is not None:
            return t, None, f"{op.name} divides an allreduce's result"
        combine, factor, why = _allreduce_combine(node.get_attr("reduce_op"),
                                                  node.get_attr("prescale_factor"),
                                                  node.get_attr("postscale_factor"))
        if why:
            return t, None, f"{op.name}: {why}"
    elif combine is None:
        combine = "sum"
    switch = strip_identity(node.inputs[0]).op
    if switch.type != "Switch" or strip_identity(switch.inputs[0]) is not strip_identity(local):
        return t, None, f"{op.name}'s collective does not take the gradient its cond passes on"
    runs = folding.scalar(switch.inputs[1])
    if runs is None:
        return t, None, f"{op.name}'s condition is not a constant (elastic Horovod)"
    return local, Collective(combine, factor, bool(runs)), ""
