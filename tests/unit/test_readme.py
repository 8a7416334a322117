"""The README's commands work as a reader pastes them: the quick start in fresh shells after the set-up command
(which installs into .venv without activating it), and the CPU-only install is there for who wants it."""

import re
import subprocess

import pytest

from daemons import REPO

README = (REPO / "README.md").read_text()


def _section(title: str) -> str:
    start = README.index(f"\n## {title}")
    end = README.find("\n## ", start + 1)
    return README[start:end]


def _quick_start_terminals() -> dict[str, list[str]]:
    """The quick start's commands, by terminal, continuation lines joined."""
    block = re.search(r"```bash\n(.*?)```", _section("Quick start"), re.S).group(1)
    terminals: dict[str, list[str]] = {}
    current = None
    for line in block.replace("\\\n", " ").splitlines():
        comment = re.match(r"#\s*(terminal \d+)", line)
        if comment:
            current = terminals.setdefault(comment.group(1), [])
        elif line.strip() and not line.lstrip().startswith("#"):
            current.append(line.split(" #")[0].strip())
    return terminals


def test_the_quick_start_runs_swarmd_in_a_fresh_shell_after_the_set_up():
    """Each terminal's lines, pasted one by one into a new shell in the checkout: every swarmd they run is found
    (the set-up's own .venv/bin/swarmd), though nothing activated the venv before."""
    if not (REPO / ".venv" / "bin" / "swarmd").exists():
        pytest.skip("the README's set-up command was not run in this checkout (no .venv/bin/swarmd)")
    terminals = _quick_start_terminals()
    assert len(terminals) >= 2, terminals
    for name, lines in terminals.items():
        script = []
        for line in lines:
            program = line.split()[0]
            if program.endswith("swarmd"):  # run everything else; check that this one would run
                script.append(f'[ "$(command -v {program})" = "{REPO}/.venv/bin/swarmd" ] '
                              f'|| {{ echo "{program}: not the set-up\'s swarmd ($(command -v {program}))"; exit 1; }}')
            else:
                script.append(line)
        result = subprocess.run(["bash", "--norc", "--noprofile", "-c", "\n".join(script)], cwd=REPO, text=True,
                                capture_output=True, timeout=30, env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"})
        assert result.returncode == 0, f"{name}: {lines}\n{result.stdout}{result.stderr}"


def test_the_set_up_says_how_to_install_the_cpu_only_torch():
    set_up = _section("Set-up")
    assert "--index-url https://download.pytorch.org/whl/cpu" in set_up
    assert "python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/swarmd join" in set_up  # unchanged
