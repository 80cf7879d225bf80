"""Builds graphmod's op library (graphmod/_graphmod_ops.so) with TensorFlow's own
compile and link flags, and maps the top-level hooks/ and rewrite_rules/
folders to graphmod.hooks and graphmod.rewrite_rules."""
import os

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

NATIVE_SOURCES = ["native/table.cc", "native/kernels.cc", "native/fused_kernels.cc",
                  "native/save_kernel.cc",
                  "native/ops.cc"]


class TfBuildExt(build_ext):
    def build_extensions(self):
        import tensorflow as tf  # the TensorFlow the library will be loaded into

        for ext in self.extensions:
            # -fno-math-errno: sqrt inlines and the optimizer updates vectorize.
            ext.extra_compile_args += tf.sysconfig.get_compile_flags() + [
                "-O3", "-fPIC", "-fno-math-errno"]
            ext.extra_link_args += tf.sysconfig.get_link_flags()
        # gcc warns that -Wstrict-prototypes is invalid for C++; drop Python's C flags.
        self.compiler.compiler_so = [f for f in self.compiler.compiler_so
                                     if f != "-Wstrict-prototypes"]
        super().build_extensions()

    def get_ext_filename(self, ext_name):
        # A plain name, not a CPython extension suffix: tf.load_op_library loads it.
        return os.path.join(*ext_name.split(".")) + ".so"


setup(
    packages=["graphmod", "graphmod.rewrite", "graphmod.distributed", "graphmod.cli",
              "graphmod.hooks", "graphmod.rewrite_rules"],
    package_dir={"graphmod": "graphmod", "graphmod.hooks": "hooks",
                 "graphmod.rewrite_rules": "rewrite_rules"},
    ext_modules=[Extension("graphmod._graphmod_ops", NATIVE_SOURCES, include_dirs=["."],
                           language="c++", depends=["native/table.h", "native/table_resource.h"])],
    cmdclass={"build_ext": TfBuildExt},
)
