"""The prepared-dataset directory that `swarmd prepare albert` writes and the ALBERT task reads.

    <dir>/swarmd-prepared.json   what it holds: sequence length, vocabulary size, tokenizer, input, pair counts
    <dir>/dataset/               datasets.DatasetDict.save_to_disk: train (and validation) sentence-order pairs
    <dir>/tokenizer/             the tokenizer, save_pretrained (the collator masks with its [MASK] token)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from swarmd.errors import ConfigError

__all__ = ["MANIFEST", "FORMAT", "FORMAT_VERSION", "PreparedData", "open_prepared"]

MANIFEST = "swarmd-prepared.json"
FORMAT = "swarmd-albert-pairs"
FORMAT_VERSION = 1
COLUMNS = ("input_ids", "token_type_ids", "attention_mask", "special_tokens_mask", "sentence_order_label")


@dataclass(frozen=True)
class PreparedData:
    root: Path
    max_seq_length: int
    vocab_size: int
    splits: dict  # split name -> number of pairs
    identity: str = ""  # sha256 of its pairs and tokenizer (prepare.py data_identity); "" when prepared before it

    def tokenizer(self):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(self.root / "tokenizer"))

    def split(self, name: str):
        from datasets import load_from_disk

        return load_from_disk(str(self.root / "dataset" / name))


def open_prepared(root: Path, *, key: str, prepare: Optional[str] = None, identity: Optional[str] = None) -> PreparedData:
    """Check that `root` is a prepared ALBERT dataset, and the run's (`identity`: task.data.identity) when the run
    names its data; ConfigError naming `key` and the fix if it is not, with the run's own `swarmd prepare` command
    (`prepare`: task.data.prepare) when it has one."""
    command = (prepare or "swarmd prepare albert --input TEXT --tokenizer TOKENIZER --output DIR").replace(
        "--output DIR", f"--output {root}")
    how = (f"create it with `{command}`" + (" (the run's command), or join with --auxiliary to average without "
                                            "training" if prepare else ""))
    if not root.is_dir():
        raise ConfigError(f"{key}: {root} does not exist; {how}")
    manifest_path = root / MANIFEST
    try:
        manifest = json.loads(manifest_path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{key}: {root} is not a prepared ALBERT dataset (no {MANIFEST}); {how}") from None
    except (OSError, ValueError) as e:
        raise ConfigError(f"{key}: {manifest_path} cannot be read ({e}); prepare the dataset again") from None
    if manifest.get("format") != FORMAT or manifest.get("version") != FORMAT_VERSION:
        raise ConfigError(
            f"{key}: {root} holds {manifest.get('format')} v{manifest.get('version')}, this swarmd reads "
            f"{FORMAT} v{FORMAT_VERSION}; prepare the dataset again with this swarmd"
        )
    for part in ("dataset/train", "tokenizer"):
        if not (root / part).is_dir():
            raise ConfigError(f"{key}: {root / part} is missing; prepare the dataset again")
    data = PreparedData(
        root=root,
        max_seq_length=int(manifest["max_seq_length"]),
        vocab_size=int(manifest["vocab_size"]),
        splits=dict(manifest.get("splits", {})),
        identity=str(manifest.get("identity") or ""),
    )
    if identity and data.identity != identity:
        held = f"data {data.identity[:12]}..." if data.identity else "data prepared before swarmd recorded identities"
        raise ConfigError(f"task.data.identity: the run trains on data {identity[:12]}..., {root} holds {held}; "
                          f"prepare the run's data with `{command}`")
    return data
