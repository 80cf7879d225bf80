"""Runs one test file under pytest for its Bazel py_test target (BUILD), in
the test's own temporary folder (Bazel runs tests side by side)."""
import os
import sys

import pytest

temp = os.path.join(os.environ.get("TEST_TMPDIR", "/tmp"), "pytest")
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", f"--basetemp={temp}", *sys.argv[1:]]))
