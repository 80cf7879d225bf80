"""graphmod as users install it: a wheel built by `pip wheel .` from a clean
checkout, installed into a fresh venv that already holds `tensorflow` (not
`-cpu`) 2.15.1, keeps that TensorFlow, imports from any directory and trains
the table API demo; `pip install .` there builds against that TensorFlow.
A build without TensorFlow, and a library recorded as built against another
TensorFlow, fail saying so.

The fresh venv takes `tensorflow==2.15.1` from PyPI (pip's cache after the
first run) and ~1.7 GB of disk, removed at the end."""
import json
import os
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.slow


def run(args, cwd, timeout=900, check=True):
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={k: v for k, v in os.environ.items()
                               if k not in ("PYTHONPATH", "GRAPHMOD_OPS_LIBRARY")})
    if check and done.returncode:
        raise AssertionError(f"{args} exited {done.returncode}:\n{done.stdout[-3000:]}\n"
                             f"{done.stderr[-3000:]}")
    return done


def clean_checkout(dest):
    """The checkout's tracked and new files, as a clone would have them (no
    op library built in place, no build folders)."""
    files = run(["git", "ls-files", "-co", "--exclude-standard"], REPO).stdout.split()
    for rel in files:
        src, to = os.path.join(REPO, rel), os.path.join(dest, rel)
        if os.path.islink(src):  # graphmod/hooks -> ../hooks: a clone keeps the link
            os.makedirs(os.path.dirname(to), exist_ok=True)
            os.symlink(os.readlink(src), to)
        elif os.path.isfile(src):
            os.makedirs(os.path.dirname(to), exist_ok=True)
            shutil.copy2(src, to)
    return str(dest)


@pytest.fixture(scope="module")
def checkout(tmp_path_factory):
    return clean_checkout(tmp_path_factory.mktemp("packaging") / "src")


@pytest.fixture(scope="module")
def wheel(checkout, tmp_path_factory):
    """`pip wheel .` with pip's default build isolation: the isolated build
    finds this environment's TensorFlow (tensorflow-cpu 2.15.1)."""
    wheels = tmp_path_factory.mktemp("wheels")
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), checkout],
        str(wheels))
    (built,) = os.listdir(wheels)
    return str(wheels / built)


def pip_list(python):
    listed = run([python, "-m", "pip", "list", "--format=json"], "/").stdout
    return {p["name"].lower(): p["version"] for p in json.loads(listed)}


def test_the_wheel_keeps_the_users_tensorflow_and_trains_the_demo(wheel, checkout, tmp_path):
    venv = tmp_path / "venv"
    python = str(venv / "bin" / "python")
    try:
        run([sys.executable, "-m", "venv", str(venv)], str(tmp_path))
        run([python, "-m", "pip", "install", "-q", "tensorflow==2.15.1"], str(tmp_path))
        run([python, "-m", "pip", "install", "-q", wheel], str(tmp_path))
        installed = pip_list(python)
        assert installed["tensorflow"] == "2.15.1" and "tensorflow-cpu" not in installed
        assert installed["graphmod"] == "0.1.0"

        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        where = run([python, "-c", "import graphmod, graphmod.hooks, graphmod._ops as o; "
                     "print(graphmod.__file__); print(o.library_path)"], str(elsewhere))
        site = str(venv / "lib")
        assert all(line.startswith(site) for line in where.stdout.split()), where.stdout

        help_ = run([str(venv / "bin" / "graphmod"), "diff", "--help"], str(elsewhere))
        assert "usage: graphmod diff" in help_.stdout

        shutil.copy(os.path.join(REPO, "examples", "table_api_demo.py"), elsewhere)
        shutil.copy(os.path.join(REPO, "examples", "synthetic.py"), elsewhere)
        demo = run([python, "table_api_demo.py", "--train_steps", "150", "--eval_examples",
                    "4000", "--model_dir", str(tmp_path / "model")], str(elsewhere))
        out = demo.stdout + demo.stderr
        total = [line for line in out.splitlines() if line.strip().startswith("total:")]
        assert total and int(total[0].split()[1].replace(",", "")) > 10_000, out[-2000:]
        assert os.path.exists(tmp_path / "model" / "checkpoint")

        # The record beside the library says which TensorFlow it was built
        # against; another one refuses to load it, saying so.
        record = where.stdout.split()[1].replace(".so", ".json")
        with open(record) as f:
            assert json.load(f) == {"tensorflow": "2.15.1"}
        with open(record, "w") as f:
            json.dump({"tensorflow": "2.14.0"}, f)
        refused = run([python, "-c", "import graphmod"], str(elsewhere), check=False)
        assert refused.returncode == 1
        assert "built against TensorFlow 2.14.0, but this process runs TensorFlow 2.15.1" \
            in refused.stderr
        # The remedy it names: `pip install .` builds (isolated, as pip does by
        # default) against this venv's `tensorflow`.
        run([python, "-m", "pip", "install", "-q", "--force-reinstall", "--no-deps", checkout],
            str(elsewhere))
        with open(record) as f:
            assert json.load(f) == {"tensorflow": "2.15.1"}
        run([python, "-c", "import graphmod, tensorflow as tf\n"
             "with tf.Graph().as_default(): graphmod.create_table('t', 4)"], str(elsewhere))
        assert pip_list(python)["tensorflow"] == "2.15.1"
    finally:
        shutil.rmtree(venv, ignore_errors=True)


def test_building_without_tensorflow_says_what_to_install(checkout, tmp_path):
    venv = tmp_path / "venv"
    python = str(venv / "bin" / "python")
    run([sys.executable, "-m", "venv", str(venv)], str(tmp_path))
    done = run([python, "-m", "pip", "install", "--no-deps", checkout], str(tmp_path),
               check=False)
    assert done.returncode != 0
    out = done.stdout + done.stderr
    assert "graphmod: no TensorFlow importable by" in out and \
        "install tensorflow or tensorflow-cpu 2.15.x first" in out, out[-3000:]
