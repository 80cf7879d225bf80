"""Offline shim for @rules_cc//cc:defs.bzl.

The real rules_cc (at the versions matching Bazel 4) is only a thin wrapper
around the native C++ rules, so forwarding to native.* keeps
`load("@rules_cc//cc:defs.bzl", ...)` working without a download.
"""

def cc_library(**attrs):
    native.cc_library(**attrs)

def cc_binary(**attrs):
    native.cc_binary(**attrs)

def cc_test(**attrs):
    native.cc_test(**attrs)

def cc_import(**attrs):
    native.cc_import(**attrs)

def cc_toolchain(**attrs):
    native.cc_toolchain(**attrs)

def cc_toolchain_suite(**attrs):
    native.cc_toolchain_suite(**attrs)
