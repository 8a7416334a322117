"""The run's manifest: the run-wide part of its config, versioned and signed by the run's key.

The founder makes the run's key once (`swarmd run init`, `run-keys/<run_id>.key` in its state dir, mode 0600); its
`swarmd join --config` signs the run-wide keys of that config (config/schema.py RUN_WIDE_KEYS) with it, and every
peer of the run serves the signed manifest in the DHT (swarm/manifest_records.py). A joiner with no config takes
the run's settings from it, after checking the signature and that the key is the one it pinned for the run id
(trust on first use, or `--run-key`).

What is signed is one JSON text (the `manifest` string of the envelope), verified as received, so no two encoders
have to agree on a canonical form. Everything read from the network goes through `decode`: bounded in size,
every field's type checked, the signature verified, the run id compared; it raises BadManifest, never anything else.

The key is an RSA key as hivemind makes them (hivemind.utils.crypto: PSS, SHA-256), the kind the identity key is.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Optional

from swarmd import __version__
from swarmd.config.names import is_run_id
from swarmd.errors import ConfigError

__all__ = [
    "FORMAT",
    "MAX_MANIFEST_BYTES",
    "BadManifest",
    "Manifest",
    "Choice",
    "run_key_path",
    "pin_path",
    "stored_manifest_path",
    "create_run_key",
    "load_run_key",
    "fingerprint_of",
    "manifest_config",
    "sign",
    "decode",
    "choose",
    "pin_run_key",
    "read_pin",
    "check_run_key_flag",
    "conflicts",
    "version_allows",
    "summary",
]

FORMAT = "swarmd-run-manifest/1"
MAX_MANIFEST_BYTES = 32 * 1024  # the albert-micro manifest is ~4 kB; a DHT value, sent to every reader
KEY_DIR = "run-keys"
_FIELDS = {"format", "run_id", "version", "created", "protocol", "swarmd_versions", "config", "public_key"}
_FINGERPRINT = re.compile(r"^[0-9a-f]{64}$")
_VERSION_RULE = re.compile(r"^(>=|<=|==|<|>)\s*(\d+(?:\.\d+){0,3})$")


class BadManifest(ValueError):
    """A manifest that is not the run's: malformed, too large, forged, or for another run."""


@dataclass(frozen=True)
class Manifest:
    run_id: str
    version: int
    created: float
    protocol: int
    swarmd_versions: str
    config: dict
    public_key: str  # the run's RSA public key, OpenSSH format
    envelope: bytes  # what is stored in the DHT: the signed text and its signature

    @property
    def fingerprint(self) -> str:
        return fingerprint_of(self.public_key)


def run_key_path(state_dir: Path, run_id: str) -> Path:
    return Path(state_dir) / KEY_DIR / f"{run_id}.key"


def pin_path(state_dir: Path, run_id: str) -> Path:
    return Path(state_dir) / KEY_DIR / f"{run_id}.pinned"


def stored_manifest_path(state_dir: Path, run_id: str) -> Path:
    return Path(state_dir) / KEY_DIR / f"{run_id}.manifest"


def fingerprint_of(public_key: str) -> str:
    """sha256 of the public key's text, in hex: what `--run-key` takes and the pin file holds."""
    return hashlib.sha256(public_key.encode("utf-8")).hexdigest()


def _crypto():
    """hivemind.utils.crypto, imported without the deprecation notices of torch that importing hivemind prints."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from hivemind.utils import crypto
    return crypto


def create_run_key(path: Path):
    """A new RSA key in `path` (mode 0600; an existing one is never replaced); returns it."""
    RSAPrivateKey = _crypto().RSAPrivateKey

    path = Path(path)
    if path.exists():
        raise ConfigError(f"the run's key {path} already exists; it signs the run's manifest, so it is kept "
                          "(delete it to found the run anew: peers that pinned the old key will refuse the new one)")
    _private_dir(path.parent)
    key = RSAPrivateKey()
    _write_private(path, key.to_bytes())
    return key


def load_run_key(path: Path):
    from cryptography.hazmat.primitives import serialization

    RSAPrivateKey = _crypto().RSAPrivateKey
    try:
        data = Path(path).read_bytes()
        key = RSAPrivateKey.__new__(RSAPrivateKey)  # RSAPrivateKey() would generate a fresh key
        key._private_key = serialization.load_der_private_key(data, password=None)
    except (OSError, ValueError, TypeError) as e:
        raise ConfigError(f"the run's key {path} cannot be read ({e})") from None
    return key


def manifest_config(config) -> dict[str, Any]:
    """The run-wide part of a config (SwarmdConfig) as the manifest carries it: a private run's allow-list as
    the peer ids themselves, not the path of a file on the founder's machine."""
    from swarmd.config.peer_list import read_allowed_peers
    from swarmd.config.schema import run_wide_part

    data = run_wide_part(config.to_dict())
    allowed = config.network.allowed_peers
    if allowed is not None:
        data.setdefault("network", {})["allowed_peers"] = sorted(read_allowed_peers(allowed))
    return data


def sign(key, *, run_id: str, version: int, config: dict[str, Any], created: Optional[float] = None) -> Manifest:
    """A manifest of `config` (run-wide keys as plain data) signed with the run's key."""
    from swarmd.swarm.compatibility import PROTOCOL_VERSION

    public_key = key.get_public_key().to_bytes().decode("ascii")
    body = json.dumps({
        "format": FORMAT,
        "run_id": run_id,
        "version": int(version),
        "created": float(time.time() if created is None else created),
        "protocol": PROTOCOL_VERSION,
        "swarmd_versions": f">={__version__}",
        "config": config,
        "public_key": public_key,
    }, sort_keys=True, separators=(",", ":"))
    signature = key.sign(body.encode("utf-8")).decode("ascii")
    envelope = json.dumps({"manifest": body, "signature": signature}).encode("utf-8")
    if len(envelope) > MAX_MANIFEST_BYTES:
        raise ConfigError(f"the run's manifest would take {len(envelope)} bytes, more than the {MAX_MANIFEST_BYTES} "
                          "a peer accepts; shorten the run-wide settings (a long network.allowed_peers?)")
    return decode(envelope, run_id=run_id)


def decode(envelope: Any, *, run_id: Optional[str] = None) -> Manifest:
    """The manifest in `envelope` (bytes from a peer), checked; raises BadManifest saying why not."""
    if not isinstance(envelope, bytes) or len(envelope) > MAX_MANIFEST_BYTES:
        raise BadManifest("not bytes, or larger than the bound")
    try:
        outer = json.loads(envelope.decode("utf-8"))
        body_text, signature = outer["manifest"], outer["signature"]
        if not isinstance(body_text, str) or not isinstance(signature, str) or set(outer) != {"manifest", "signature"}:
            raise BadManifest("the envelope is not {manifest, signature}")
        body = json.loads(body_text)
    except (UnicodeDecodeError, ValueError, KeyError, TypeError):
        raise BadManifest("not a JSON envelope") from None
    _check_fields(body)
    if run_id is not None and body["run_id"] != run_id:
        raise BadManifest(f"a manifest of run {body['run_id']!r}, not {run_id!r}")
    if not _verify(body["public_key"], body_text.encode("utf-8"), signature.encode("ascii", "replace")):
        raise BadManifest("the signature does not match the manifest's key")
    return Manifest(run_id=body["run_id"], version=body["version"], created=float(body["created"]),
                    protocol=body["protocol"], swarmd_versions=body["swarmd_versions"], config=body["config"],
                    public_key=body["public_key"], envelope=envelope)


def _check_fields(body: Any) -> None:
    if not isinstance(body, dict) or set(body) != _FIELDS or body["format"] != FORMAT:
        raise BadManifest("not a manifest of this format")
    checks = (
        ("run_id", isinstance(body["run_id"], str) and is_run_id(body["run_id"])),
        ("version", type(body["version"]) is int and 1 <= body["version"] < 2**31),
        ("created", type(body["created"]) in (int, float) and math.isfinite(body["created"])),
        ("protocol", type(body["protocol"]) is int and 0 <= body["protocol"] < 2**31),
        ("swarmd_versions", isinstance(body["swarmd_versions"], str)
         and re.match(r"^[0-9A-Za-z.,<>=! ]{0,64}$", body["swarmd_versions"]) is not None),  # shown as it is
        ("config", isinstance(body["config"], dict) and body["config"].get("run_id") == body["run_id"]),
        ("public_key", isinstance(body["public_key"], str) and body["public_key"].startswith("ssh-rsa ")
         and len(body["public_key"]) <= 2048),
    )
    for name, ok in checks:
        if not ok:
            raise BadManifest(f"its {name} is malformed")


def _verify(public_key: str, data: bytes, signature: bytes) -> bool:
    RSAPublicKey = _crypto().RSAPublicKey
    try:
        return RSAPublicKey.from_bytes(public_key.encode("ascii")).verify(data, signature)
    except (ValueError, TypeError, UnicodeEncodeError):
        return False


@dataclass
class Choice:
    """What a reader made of the manifests it found for a run: the newest under the pinned key, and what it left."""

    manifest: Optional[Manifest] = None
    keys: tuple = ()  # fingerprints of the valid manifests found (several, with nothing pinned: ambiguous)
    malformed: int = 0  # unreadable, forged (the signature fails), or for another run
    other_key: int = 0  # valid, but signed by another key than the pinned one
    older: int = 0  # valid versions below the newest


def choose(entries: Iterable[tuple[Any, Any]], run_id: str, pinned: Optional[str], *, limit: int = 64) -> Choice:
    """The manifest to follow among (subkey, value) pairs a DHT read returned; never raises on what peers stored.

    With `pinned` (a key fingerprint) only that key's manifests count; without, exactly one key must have signed
    (else `keys` lists them and `manifest` stays None: the caller asks for --run-key)."""
    choice = Choice()
    valid: list[Manifest] = []
    for index, (_subkey, value) in enumerate(entries):
        if index >= limit:  # a flood of entries: read a bounded number
            choice.malformed += 1
            continue
        try:
            valid.append(decode(value, run_id=run_id))
        except BadManifest:
            choice.malformed += 1
    if pinned is not None:
        choice.other_key = sum(1 for m in valid if m.fingerprint != pinned)
        valid = [m for m in valid if m.fingerprint == pinned]
    choice.keys = tuple(sorted({m.fingerprint for m in valid}))
    if len(choice.keys) == 1:
        choice.manifest = max(valid, key=lambda m: m.version)
        choice.older = sum(1 for m in valid if m.version < choice.manifest.version)
    return choice


def pin_run_key(state_dir: Path, run_id: str, fingerprint: str, *, given: Optional[str] = None) -> bool:
    """Check `fingerprint` (a manifest's key) against the key pinned for `run_id` in the state dir, and pin it if
    none is (trust on first use). `given`: the --run-key of the command line, pinned up front. True if newly
    pinned. Raises ConfigError on another key: a pinned peer never follows a new key by itself."""
    path = pin_path(state_dir, run_id)
    pinned = read_pin(state_dir, run_id)
    expected = given or pinned
    if given is not None and pinned is not None and given != pinned:
        raise ConfigError(f"--run-key {given[:16]}... differs from the key pinned for run {run_id} ({pinned[:16]}..., "
                          f"in {path}); delete that file to trust the new key")
    if expected is not None and fingerprint != expected:
        raise ConfigError(f"the manifest of run {run_id} is signed by key {fingerprint[:16]}..., not by the run's "
                          f"key {expected[:16]}... this peer trusts ({'--run-key' if given else path}); refusing it. "
                          "If the run was founded anew, delete that file (or pass the new --run-key)")
    if pinned is None:
        _private_dir(path.parent)
        _write_private(path, (fingerprint + "\n").encode("ascii"))
        return True
    return False


def read_pin(state_dir: Path, run_id: str) -> Optional[str]:
    path = pin_path(state_dir, run_id)
    try:
        text = path.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"the pinned run key {path} cannot be read ({e})") from None
    if not _FINGERPRINT.match(text):
        raise ConfigError(f"the pinned run key {path} is not a key fingerprint (64 hex digits); delete it to pin anew")
    return text


def check_run_key_flag(value: Optional[str]) -> Optional[str]:
    if value is None:
        return None
    text = value.strip().lower()
    if not _FINGERPRINT.match(text):
        raise ConfigError(f"--run-key {value!r}: expected the run key's fingerprint (64 hex digits), as "
                          "`swarmd run init` prints it")
    return text


def conflicts(run_wide: dict[str, Any], effective: dict[str, Any], prefix: str = "") -> list[tuple[str, Any, Any]]:
    """(dotted key, the manifest's value, this peer's value) for every run-wide leaf this peer set otherwise."""
    found = []
    for key, value in run_wide.items():
        dotted = prefix + key
        mine = effective.get(key) if isinstance(effective, dict) else None
        if isinstance(value, dict) and isinstance(mine, dict):
            found.extend(conflicts(value, mine, dotted + "."))
        elif value != mine:
            found.append((dotted, value, mine))
    return found


def version_allows(rule: str, version: str) -> bool:
    """Whether `version` (X.Y.Z) satisfies a manifest's swarmd_versions (">=0.1.0", ">=0.1,<0.3"); an unreadable
    rule allows nothing."""
    try:
        have = _numbers(version)
        for part in rule.split(","):
            match = _VERSION_RULE.match(part.strip())
            if match is None:
                return False
            op, want = match.group(1), _numbers(match.group(2))
            size = max(len(have), len(want))
            a, b = have + (0,) * (size - len(have)), want + (0,) * (size - len(want))
            if not {">=": a >= b, "<=": a <= b, "==": a == b, "<": a < b, ">": a > b}[op]:
                return False
        return True
    except ValueError:
        return False


def summary(manifest: Manifest) -> str:
    """One line: what the run is. The values are the founder's word, shown escaped and clipped."""
    config = manifest.config

    def section(name: str) -> dict:
        value = config.get(name)
        return value if isinstance(value, dict) else {}

    task, swarm, training = section("task"), section("swarm"), section("training")
    model = task.get("model", {}).get("name") if isinstance(task.get("model"), dict) else task.get("model")
    allowed = section("network").get("allowed_peers")
    access = f"private ({len(allowed)} peers)" if isinstance(allowed, list) else "open"
    shown = [_shown(value) for value in (task.get("name"), model or "default", swarm.get("strategy"),
                                         swarm.get("target_batch_size"), training.get("batch_size"),
                                         training.get("precision"))]
    data = task.get("data") if isinstance(task.get("data"), dict) else {}
    prepared = (f", data {_shown(str(data.get('identity') or 'unnamed')[:16])} (prepare: "
                f"{_shown(data.get('prepare'), 200)})" if data.get("prepare") else "")
    return (f"run {manifest.run_id} (manifest v{manifest.version}, key {manifest.fingerprint[:16]}): task {shown[0]}, "
            f"model {shown[1]}, strategy {shown[2]}, target batch {shown[3]}, batch {shown[4]}, precision "
            f"{shown[5]}, {access}{prepared}")


def _shown(value: Any, limit: int = 48) -> str:
    text = "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in str(value))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _numbers(text: str) -> tuple[int, ...]:
    match = re.match(r"^\d+(?:\.\d+)*", text.strip())
    if match is None:
        raise ValueError(text)
    return tuple(int(part) for part in match.group(0).split("."))


def _private_dir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o700)


def _write_private(path: Path, data: bytes) -> None:
    """Written aside with mode 0600 from the start, then renamed into place."""
    aside = path.with_name(path.name + ".tmp")
    fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(aside, path)
