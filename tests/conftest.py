import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from daemons import DaemonProcess  # noqa: E402

from swarmd.config.task_resolver import use_task_resolver  # noqa: E402
from swarmd.tasks.registry import resolve_task  # noqa: E402

use_task_resolver(resolve_task)  # as the CLI does: the tests call swarmd.config.load_config directly

# Keep child processes from fighting over the two cores of a CI box.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def shared_data(tmp_path_factory) -> Path:
    """One generated image folder for every daemon of the session (each would otherwise draw its own)."""
    return tmp_path_factory.mktemp("shared-data")


@pytest.fixture
def daemons(tmp_path):
    """Factory of DaemonProcess objects; every process they started is killed at teardown."""
    started: list[DaemonProcess] = []

    def start(name: str, config: dict, *, extra_args=(), env=None, state_dir=None) -> DaemonProcess:
        daemon = DaemonProcess(state_dir or tmp_path / name, config, extra_args=extra_args, env=env, name=name)
        started.append(daemon)
        return daemon.start()

    yield start
    for daemon in started:
        daemon.close()
        # Shown by pytest only when the test failed: every peer's last lines, not just the one a wait timed out on.
        print(f"----- last lines of {daemon.name} ({daemon.log_path}) -----\n{daemon.tail(60)}")


PLUGIN_SOURCE = Path(__file__).resolve().parent / "plugins" / "swarmd-test-tasks"


@pytest.fixture(scope="session")
def test_tasks_env(tmp_path_factory) -> dict:
    """The test-only task plug-ins (toy-regression, faulty, hang-test) pip-installed into a folder of their own,
    as a third-party package would be (not into the venv), and an environment whose PYTHONPATH finds them."""
    import shutil

    work = tmp_path_factory.mktemp("test-tasks")
    source = work / "source"
    shutil.copytree(PLUGIN_SOURCE, source)  # setuptools writes build/ and egg-info next to the sources
    target = work / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-input",
         "--target", str(target), str(source)],
        check=True, capture_output=True, text=True, timeout=300,
    )
    return {"PYTHONPATH": os.pathsep.join(p for p in (str(target), os.environ.get("PYTHONPATH")) if p)}


@pytest.fixture(scope="session")
def albert_prepared(tmp_path_factory):
    """`swarmd prepare albert` (first run) on a corpus the tests generate, with a WordPiece tokenizer they train on
    it with `tokenizers`; `args` re-runs the same preparation."""
    from types import SimpleNamespace

    from daemons import run_cli
    from swarmd.tasks.albert.corpus import generate_documents, train_tokenizer, write_corpus

    work = tmp_path_factory.mktemp("albert")
    write_corpus(work / "corpus", generate_documents(600, seed=3))
    train_tokenizer(sorted(str(p) for p in (work / "corpus").iterdir()), 600, work / "tokenizer")
    args = [
        "prepare", "albert",
        "--input", str(work / "corpus"),
        "--tokenizer", str(work / "tokenizer"),
        "--output", str(work / "prepared"),
        "--max-seq-length", "64",
        "--num-proc", "2",
        "--validation-fraction", "0.05",
        "--cache-dir", str(work / "cache"),
    ]
    first = run_cli(*args, timeout=300)
    return SimpleNamespace(work=work, output=work / "prepared", args=args, first_run=first)
