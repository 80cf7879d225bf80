"""Builds graphmod's op library (graphmod/_graphmod_ops.so) with the compile and
link flags of the TensorFlow it will be loaded into."""
import glob
import json
import os
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

NATIVE_SOURCES = ["native/memory.cc", "native/key_index.cc", "native/arena_row_store.cc",
                  "native/row_buckets.cc",
                  "native/row_codec.cc", "native/admission.cc", "native/eviction.cc",
                  "native/initializer.cc",
                  "native/optimizer_math.cc", "native/batch.cc", "native/crc32c.cc",
                  "native/segment_file.cc", "native/cold_index.cc", "native/log_tier.cc",
                  "native/table.cc", "native/exchange_plan.cc",
                  "native/kernels.cc", "native/fused_kernels.cc", "native/save_kernel.cc",
                  "native/restore_kernel.cc", "native/exchange_kernels.cc",
                  "native/ops.cc"]
HERE = os.path.dirname(os.path.abspath(__file__))
SUPPORTED_TF = "2.15"  # tf.estimator and TF1 graphs; 2.16 drops the Estimator
_TF_QUERY = ("import json, tensorflow as tf; print(json.dumps([tf.__version__, "
             "tf.sysconfig.get_compile_flags(), tf.sysconfig.get_link_flags()]))")


def target_tensorflow():
    """(version, compile flags, link flags) of the TensorFlow in the
    environment graphmod is being installed into."""
    try:
        import tensorflow as tf  # --no-build-isolation: this very environment
        return tf.__version__, tf.sysconfig.get_compile_flags(), tf.sysconfig.get_link_flags()
    except ImportError:
        pass
    # pip's build isolation runs this script with the target's interpreter and
    # hides the target's packages behind PYTHONPATH: without it they are seen.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONNOUSERSITE")}
    run = subprocess.run([sys.executable, "-c", _TF_QUERY], env=env,
                         capture_output=True, text=True)
    if run.returncode:
        last = (run.stderr.strip().splitlines() or ["no output"])[-1]
        sys.exit(f"graphmod: no TensorFlow importable by {sys.executable} ({last}). "
                 f"graphmod's op library compiles against the TensorFlow it will run with: "
                 f"install tensorflow or tensorflow-cpu {SUPPORTED_TF}.x first. (If it is "
                 f"installed: a build frontend that builds in a virtualenv of its own, "
                 f"python -m build or uv, cannot see it; build with --no-build-isolation.)")
    return tuple(json.loads(run.stdout.strip().splitlines()[-1]))


def _recorded(record: str):
    try:
        with open(record) as f:
            return json.load(f).get("tensorflow")
    except (OSError, ValueError, AttributeError):
        return None


class TfBuildExt(build_ext):
    def build_extensions(self):
        version, compile_flags, link_flags = target_tensorflow()
        if ".".join(version.split(".")[:2]) != SUPPORTED_TF:
            sys.exit(f"graphmod supports TensorFlow {SUPPORTED_TF}.x; {sys.executable} has "
                     f"TensorFlow {version}.")
        print(f"graphmod: building the op library against TensorFlow {version}")
        if any(_recorded(self._record(ext)) != version for ext in self.extensions):
            self.force = True  # a library left in build/ by another TensorFlow's build
        for ext in self.extensions:
            # -fno-math-errno: sqrt inlines and the optimizer updates vectorize.
            ext.extra_compile_args += compile_flags + ["-O3", "-fPIC", "-fno-math-errno"]
            ext.extra_link_args += link_flags
        # gcc warns that -Wstrict-prototypes is invalid for C++; drop Python's C flags.
        self.compiler.compiler_so = [f for f in self.compiler.compiler_so
                                     if f != "-Wstrict-prototypes"]
        super().build_extensions()
        for ext in self.extensions:
            # Beside the library, which TensorFlow it was built against:
            # graphmod/_ops.py refuses to load it into another one. An editable
            # install copies the library (only) from its build folder into the
            # checkout, so the record is written there too.
            records = {self._record(ext)}
            if getattr(self, "editable_mode", False):
                records.add(os.path.join(HERE, *ext.name.split(".")) + ".json")
            for record in records:
                with open(record, "w") as f:
                    json.dump({"tensorflow": version}, f)

    def _record(self, ext) -> str:
        return os.path.splitext(self.get_ext_fullpath(ext.name))[0] + ".json"

    def get_ext_filename(self, ext_name):
        # A plain name, not a CPython extension suffix: tf.load_op_library loads it.
        return os.path.join(*ext_name.split(".")) + ".so"


setup(
    # graphmod/hooks and graphmod/rewrite_rules are links to the top-level
    # hooks/ and rewrite_rules/ folders: the wheel holds their files there.
    packages=["graphmod", "graphmod.embeddings", "graphmod.checkpoint", "graphmod.rewrite",
              "graphmod.horovod", "graphmod.ps", "graphmod.cli", "graphmod.hooks",
              "graphmod.rewrite_rules"],
    py_modules=["graphmod_cli"],  # the command's front, importable without TensorFlow
    ext_modules=[Extension("graphmod._graphmod_ops", NATIVE_SOURCES, include_dirs=["."],
                           language="c++", depends=sorted(glob.glob("native/*.h")))],
    cmdclass={"build_ext": TfBuildExt},
)
