"""Reading the graphs `graphmod diff` and `graphmod rewrite` take.

A graph argument is a GraphDef (`.pb` binary, `.pbtxt` text), a
MetaGraphDef (`.meta`, or `.pb`/`.pbtxt` holding one), or a model_dir in
which GraphModifierHook(dump_graph=True) wrote
`graphmod/graph_{before,after}_<mode>.pbtxt` (with the rewrite's record and
report beside them). Anything unreadable raises InputError naming the path.
"""
import dataclasses
import json
import os
from typing import Optional

from google.protobuf import message, text_format
from tensorflow.core.framework import graph_pb2
from tensorflow.core.protobuf import meta_graph_pb2
import tensorflow as tf

MODES = ("train", "eval", "predict")


class InputError(Exception):
    """An input the command cannot read (exit status 2); says which and why."""


@dataclasses.dataclass
class Loaded:
    graph_def: graph_pb2.GraphDef
    meta_graph: Optional[meta_graph_pb2.MetaGraphDef]  # when the file held one
    path: str


def _parse(path: str, data: bytes):
    """A MetaGraphDef or GraphDef from a file's bytes, binary or text."""
    text = path.endswith(".pbtxt") or path.endswith(".txt")
    kinds = (meta_graph_pb2.MetaGraphDef, graph_pb2.GraphDef)
    if path.endswith(".meta"):
        kinds = kinds[:1]
    errors = []
    for kind in kinds:
        proto = kind()
        try:
            if text:
                text_format.Parse(data.decode("utf-8"), proto)
            else:
                proto.ParseFromString(data)
        except (message.DecodeError, text_format.ParseError, UnicodeDecodeError) as e:
            errors.append(f"{kind.__name__}: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
            continue
        graph_def = proto.graph_def if isinstance(proto, meta_graph_pb2.MetaGraphDef) else proto
        if not graph_def.node:
            errors.append(f"{kind.__name__}: no nodes")
        elif not text and not graph_def.versions.producer:
            # TensorFlow writes `versions` last: a binary file cut short at a
            # field boundary parses, but without it.
            errors.append(f"{kind.__name__}: truncated (no versions after the nodes)")
        else:
            return proto
    raise InputError(f"{path}: not a GraphDef or MetaGraphDef ({'; '.join(errors)})")


def load_file(path: str) -> Loaded:
    if not tf.io.gfile.exists(path):
        raise InputError(f"{path}: no such file or directory")
    with tf.io.gfile.GFile(path, "rb") as f:
        data = f.read()
    if not data:
        raise InputError(f"{path}: empty file")
    proto = _parse(path, data)
    if isinstance(proto, meta_graph_pb2.MetaGraphDef):
        return Loaded(proto.graph_def, proto, path)
    return Loaded(proto, None, path)


def dumps(model_dir: str, mode: Optional[str] = None) -> dict:
    """The graphs GraphModifierHook(dump_graph=True) wrote in model_dir:
    {"before", "after", "record", "report"} paths (record and report may be
    None), for `mode` or the first of train, eval, predict found."""
    if not tf.io.gfile.isdir(model_dir):
        raise InputError(f"{model_dir}: no such directory")
    folder = os.path.join(model_dir, "graphmod")
    for m in ([mode] if mode else MODES):
        before = os.path.join(folder, f"graph_before_{m}.pbtxt")
        after = os.path.join(folder, f"graph_after_{m}.pbtxt")
        if tf.io.gfile.exists(before) and tf.io.gfile.exists(after):
            record = os.path.join(folder, f"rewrite_record_{m}.json")
            report = os.path.join(folder, f"rewrite_report_{m}.json")
            return dict(before=before, after=after, mode=m,
                        record=record if tf.io.gfile.exists(record) else None,
                        report=report if tf.io.gfile.exists(report) else None)
    what = f"graph_before_{mode}.pbtxt" if mode else "graph_before_<mode>.pbtxt"
    raise InputError(f"{model_dir}: holds no graphs to compare (no graphmod/{what} and its "
                     "graph_after; train with GraphModifierHook(dump_graph=True))")


def load_json(path: Optional[str]) -> Optional[dict]:
    if path is None:
        return None
    try:
        with tf.io.gfile.GFile(path) as f:
            return json.load(f)
    except (ValueError, OSError) as e:
        raise InputError(f"{path}: unreadable JSON ({e})") from None


def read_plan(model_dir: str):
    """The model_dir's conversion plan ({variable: Planned}) or None; an
    InputError naming the file when it cannot be read."""
    from graphmod.rewrite import plan_file  # pylint: disable=import-outside-toplevel
    try:
        return plan_file.read(model_dir)
    except ValueError as e:
        raise InputError(str(e).removeprefix("graphmod: ")) from None
