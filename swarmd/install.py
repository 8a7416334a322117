"""`swarmd service install`: put a peer under systemd with the shipped units (systemd/ in the source tree).

It writes, under a root directory (`/` on a real install; any directory for a test or an image build):
- the config:  etc/swarmd/swarmd.yaml, or etc/swarmd/NAME.yaml for the instance swarmd@NAME;
- the unit:    etc/systemd/system/swarmd.service or swarmd@.service, its ExecStart pointed at this swarmd;
- the user:    etc/sysusers.d/swarmd.conf, applied with systemd-sysusers (useradd where it is missing);
and says how to start it. It starts nothing: `systemctl enable --now` is the operator's step.

Every refusal is an InstallError (one line, exit code 2): not root, a bad name, an invalid config, a config that
sets state_dir, a file that exists (or a unit edited in place) without --force, a root that cannot be written.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from swarmd.errors import ExitCode, SwarmdError

__all__ = ["InstallError", "Installed", "install_service", "find_unit", "exec_command", "SHIPPED_EXEC"]

SHIPPED_EXEC = "/usr/local/bin/swarmd"  # what the shipped units' ExecStart names; replaced at install
USER = "swarmd"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_HIDDEN_FROM_SERVICE = ("/home/", "/root/", "/run/user/", "/tmp/", "/var/tmp/")  # ProtectHome=, PrivateTmp=


class InstallError(SwarmdError):
    exit_code = ExitCode.USAGE


@dataclass
class Installed:
    unit: str  # swarmd or swarmd@NAME
    config_file: Path
    unit_file: Path
    unit_changed: bool
    user: str  # "created", "exists", or the command still to run
    state_dir: str  # as the service sees it
    command: str  # the swarmd ExecStart runs
    warnings: list[str] = field(default_factory=list)


def install_service(
    *, config: Optional[str], name: Optional[str], root: str = "/", force: bool = False
) -> Installed:
    root_path = Path(root).resolve()
    if root_path == Path("/") and os.geteuid() != 0:
        raise InstallError(
            "installing a system service needs root: run it with sudo, or pass --root DIR to write the files into "
            "another tree"
        )
    if not root_path.is_dir():
        raise InstallError(f"--root {root}: {'not a directory' if root_path.exists() else 'does not exist'}")
    if name is not None and (not _NAME.match(name) or name == "swarmd"):
        raise InstallError(
            f"--name {name!r}: use letters, digits, '.', '_' and '-' (it names /etc/swarmd/NAME.yaml and "
            "swarmd@NAME); leave --name out for the single-peer unit swarmd.service"
        )
    instance = name is not None
    unit = f"swarmd@{name}" if instance else "swarmd"
    unit_file_name = "swarmd@.service" if instance else "swarmd.service"
    state_dir = f"/var/lib/swarmd/{name}" if instance else "/var/lib/swarmd"

    warnings: list[str] = []
    config_text = _config_text(config, unit, state_dir, warnings)
    command = exec_command()
    # the console script, the Python it runs (a venv links to it), and this package (an editable install)
    for path in sorted({command[0], os.path.realpath(sys.executable), str(Path(__file__).resolve().parent)}):
        if path.startswith(_HIDDEN_FROM_SERVICE):
            warnings.append(
                f"{path} is not visible to the service (ProtectHome=, PrivateTmp=): install swarmd, and the Python "
                "its venv uses, outside home and temporary directories, e.g. under /opt"
            )
    unit_text = _unit_text(find_unit(unit_file_name).read_text(), command)

    config_file = root_path / "etc/swarmd" / f"{name or 'swarmd'}.yaml"
    unit_file = root_path / "etc/systemd/system" / unit_file_name
    sysusers_file = root_path / "etc/sysusers.d/swarmd.conf"
    if config_file.exists() and not force:
        raise InstallError(f"{config_file} exists; pass --force to replace it (or another --name)")
    unit_changed = not unit_file.exists() or unit_file.read_text() != unit_text
    if unit_file.exists() and unit_changed and not force:
        raise InstallError(
            f"{unit_file} differs from this swarmd's unit (edited in place? put changes in a drop-in with "
            f"`systemctl edit {unit_file_name}`); pass --force to replace it"
        )

    _write(config_file, config_text, dir_mode=0o755)
    if unit_changed:
        _write(unit_file, unit_text, dir_mode=0o755)
    _write(sysusers_file, find_unit("swarmd.sysusers").read_text(), dir_mode=0o755)
    user = _create_user(root_path, sysusers_file)
    return Installed(unit, config_file, unit_file, unit_changed, user, state_dir, " ".join(command), warnings)


def find_unit(file_name: str) -> Path:
    """A shipped file of systemd/: from a source checkout (editable install) or the installed data files."""
    candidates = [
        Path(__file__).resolve().parent.parent / "systemd" / file_name,
        Path(sys.prefix) / "share" / "swarmd" / "systemd" / file_name,
    ]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise SwarmdError(f"{file_name} is not installed with this swarmd (looked in {', '.join(map(str, candidates))})")


def exec_command() -> list[str]:
    """How systemd should start this swarmd: its console script, or this Python with -m swarmd."""
    script = Path(sys.executable).parent / "swarmd"
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    return [sys.executable, "-m", "swarmd"]


def _unit_text(shipped: str, command: list[str]) -> str:
    old = f"ExecStart={SHIPPED_EXEC} "
    if shipped.count(old) != 1:
        raise SwarmdError(f"the shipped unit has no 'ExecStart={SHIPPED_EXEC} ...' line to point at this swarmd")
    return shipped.replace(old, "ExecStart=" + " ".join(_systemd_word(word) for word in command) + " ")


def _systemd_word(word: str) -> str:
    """One word of an ExecStart= line: % and $ are special to systemd, and a space needs quotes."""
    escaped = word.replace("%", "%%").replace("$", "$$")
    if any(c in escaped for c in " \t\"'\\"):
        escaped = '"' + escaped.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return escaped


def _config_text(config: Optional[str], unit: str, state_dir: str, warnings: list[str]) -> str:
    import yaml

    from swarmd.config import load_config
    from swarmd.config.loader import read_yaml_file

    header = (
        f"# swarmd configuration of the service {unit} (every key: `swarmd config show --config THIS_FILE`).\n"
        f"# state_dir is not set here: systemd gives the service {state_dir} ($STATE_DIRECTORY).\n"
    )
    if config is None:
        data = load_config(None, environ={}).to_dict()
        del data["state_dir"]
        return header + yaml.safe_dump(data, sort_keys=False)
    raw = read_yaml_file(config)
    load_config(config, environ={})  # the whole validation, with the loader's one-line errors
    if "state_dir" in raw:
        raise InstallError(
            f"{config} sets state_dir: under systemd the state lives in {state_dir} (StateDirectory=); "
            "remove state_dir from the file"
        )
    for key, value in _strings(raw):
        if value.startswith(_HIDDEN_FROM_SERVICE):
            warnings.append(
                f"{key}: {value} is not visible to the service (ProtectHome=, PrivateTmp=); move it, or relax "
                "the unit in a drop-in"
            )
    return header + Path(config).expanduser().read_text(encoding="utf-8")


def _strings(data: Any, prefix: str = ""):
    if isinstance(data, dict):
        for key, value in data.items():
            yield from _strings(value, f"{prefix}{key}.")
    elif isinstance(data, list):
        for index, value in enumerate(data):
            yield from _strings(value, f"{prefix}{index}.")
    elif isinstance(data, str):
        yield prefix.rstrip("."), data


def _write(path: Path, text: str, *, dir_mode: int) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=dir_mode)
        partial = path.with_name(f".{path.name}.partial")
        partial.write_text(text)
        partial.chmod(0o644)
        os.replace(partial, path)
    except OSError as e:
        raise InstallError(f"cannot write {path}: {e.strerror}") from None


def _create_user(root: Path, sysusers_file: Path) -> str:
    """The system user, from the sysusers.d file; "created", "exists" or the command the operator must run."""
    if root == Path("/"):
        try:
            pwd.getpwnam(USER)
            return "exists"
        except KeyError:
            pass
    elif _user_in(root / "etc/passwd"):
        return "exists"
    if shutil.which("systemd-sysusers"):
        args = ["systemd-sysusers", str(sysusers_file)]
        if root != Path("/"):
            args.insert(1, f"--root={root}")
        result = subprocess.run(args, capture_output=True, text=True, timeout=60)
        if result.returncode != 0:
            raise InstallError(f"systemd-sysusers could not create the user {USER}: {result.stderr.strip()}")
        return "created"
    manual = f"useradd --system --user-group --home-dir /var/lib/swarmd --no-create-home --shell /usr/sbin/nologin {USER}"
    if root == Path("/") and shutil.which("useradd"):
        result = subprocess.run(manual.split(), capture_output=True, text=True, timeout=60)
        if result.returncode != 0:
            raise InstallError(f"useradd could not create the user {USER}: {result.stderr.strip()}")
        return "created"
    return manual


def _user_in(passwd: Path) -> bool:
    try:
        return any(line.split(":", 1)[0] == USER for line in passwd.read_text().splitlines())
    except OSError:
        return False
