#!/bin/sh
# Stub: the real coverage tools are not available offline.
echo "coverage tools are not available in this offline Bazel setup" >&2
exit 1
