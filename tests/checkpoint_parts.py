"""Reading a table's rows from a checkpoint written in parts (by ps tasks or
Horovod ranks) or whole, without graphmod: what the tests compare."""
import json
import os

import numpy as np
import tensorflow as tf


def table_rows(checkpoint, table, entries=("keys", "values", "slots", "counts")):
    """The table's entries, rows sorted by key, from the checkpoint alone (its
    deltas not applied) or the parts its tables were saved in."""
    manifest = checkpoint + ".tables.json"
    prefixes = [checkpoint]
    if os.path.exists(manifest):
        with open(manifest) as f:
            files = json.load(f)["files"]
        prefixes = sorted({os.path.join(os.path.dirname(checkpoint), f.rsplit(".", 1)[0])
                           for f in files if f.endswith(".index")})
    readers = [tf.train.load_checkpoint(p) for p in prefixes]
    rows = [np.concatenate([r.get_tensor(f"{table}-{e}") for r in readers]) for e in entries]
    order = np.argsort(rows[0])
    return [x[order] for x in rows]
