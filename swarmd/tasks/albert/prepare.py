"""Text -> sentence-order-prediction pairs, tokenized with HF datasets and saved for the ALBERT task.

The pairs follow ALBERT's create_pretraining_data (as hivemind's ALBERT example does): the sentences of a document
are packed into chunks of up to max_seq_length tokens, each chunk is cut at a random sentence boundary into A and B,
and half of the pairs are swapped (sentence_order_label 1). Masking is NOT done here: the task masks every batch
afresh with transformers' DataCollatorForLanguageModeling.

The work runs as a parallel `Dataset.map` (num_proc) whose result datasets caches on disk under an explicit
fingerprint (input, tokenizer, length, seed), so re-running the same preparation reads the cache instead of
tokenizing again. Randomness is seeded per document, so the pairs do not depend on num_proc or batch boundaries.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import random
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from swarmd.errors import ConfigError
from swarmd.tasks.albert.prepared import COLUMNS, FORMAT, FORMAT_VERSION, MANIFEST

__all__ = [
    "PrepareResult", "prepare_albert_dataset", "load_tokenizer", "split_sentences", "sentence_order_pairs",
    "data_identity",
]

# A sentence ends at . ! or ? followed by white space and an upper-case letter, digit or opening quote/bracket.
# (NLTK's punkt, which hivemind's example used, needs a model download; this is close enough for pair building.)
_SENTENCE_BOUNDARY = re.compile(r"(?<=[.!?])\s+(?=[\"'(\[]?[A-Z0-9])")
_SPECIAL_TOKENS = ("cls_token", "sep_token", "mask_token", "pad_token")


@dataclass(frozen=True)
class PrepareResult:
    output: Path
    splits: dict[str, int]  # pairs per split
    reused_cache: bool  # every split came from datasets' cache (nothing was tokenized)
    cache_files: list[str]
    identity: str = ""  # data_identity of what was written


def split_sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE_BOUNDARY.split(text.strip()) if s.strip()]


def sentence_order_pairs(sentences: Sequence[str], lengths: Sequence[int], target: int, rng: random.Random):
    """(text_a, text_b, swapped) per chunk of consecutive sentences holding up to `target` tokens."""
    pairs, chunk, length = [], [], 0
    for i, (sentence, n) in enumerate(zip(sentences, lengths)):
        chunk.append(sentence)
        length += n
        if i == len(sentences) - 1 or length >= target:
            if len(chunk) >= 2:
                cut = rng.randint(1, len(chunk) - 1)
                a, b = " ".join(chunk[:cut]), " ".join(chunk[cut:])
                swapped = rng.random() < 0.5
                pairs.append((b, a, 1) if swapped else (a, b, 0))
            chunk, length = [], 0
    return pairs


class _PairBuilder:
    """The batched map function (picklable for num_proc workers)."""

    def __init__(self, tokenizer, text_column: str, max_seq_length: int, seed: int):
        self.tokenizer, self.text_column = tokenizer, text_column
        self.max_seq_length, self.seed = max_seq_length, seed
        self.target = max_seq_length - tokenizer.num_special_tokens_to_add(pair=True)

    def __call__(self, batch: dict, indices: list[int]) -> dict:
        documents = [split_sentences(text or "") for text in batch[self.text_column]]
        flat = [sentence for sentences in documents for sentence in sentences]
        counts = self.tokenizer(flat, add_special_tokens=False, return_attention_mask=False)["input_ids"] if flat else []
        lengths = iter(len(ids) for ids in counts)
        texts_a, texts_b, labels = [], [], []
        for index, sentences in zip(indices, documents):
            doc_lengths = [next(lengths) for _ in sentences]
            rng = random.Random(self.seed * 2**40 + index)
            for a, b, label in sentence_order_pairs(sentences, doc_lengths, self.target, rng):
                texts_a.append(a)
                texts_b.append(b)
                labels.append(label)
        if not labels:
            return {column: [] for column in COLUMNS}
        encoded = self.tokenizer(
            texts_a,
            texts_b,
            truncation="longest_first",
            max_length=self.max_seq_length,
            return_token_type_ids=True,
            return_attention_mask=True,
            return_special_tokens_mask=True,
        )
        return {**{column: encoded[column] for column in COLUMNS[:-1]}, "sentence_order_label": labels}


def load_tokenizer(name: str, *, key: str = "--tokenizer"):
    """A tokenizer from a save_pretrained() directory or a hub name, checked for the tokens ALBERT needs."""
    from transformers import AutoTokenizer

    path = Path(name).expanduser()
    if path.is_file():
        raise ConfigError(
            f"{key}: {path} is a file; pass the directory that holds it with tokenizer_config.json "
            "(what save_pretrained() writes), or a hub name"
        )
    if not path.exists() and name.startswith((".", "/", "~")):
        raise ConfigError(f"{key}: {path} does not exist; pass a tokenizer directory or a hub name")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path) if path.exists() else name)
    except Exception as e:  # noqa: BLE001 - transformers raises OSError, ValueError, KeyError... for bad input
        raise ConfigError(
            f"{key}: cannot load a tokenizer from {name!r} ({str(e).splitlines()[0][:200]}); pass a directory "
            "written by save_pretrained() or a hub name (downloaded, or already in the local cache)"
        ) from None
    missing = [attr for attr in _SPECIAL_TOKENS if getattr(tokenizer, attr, None) is None]
    if missing:
        raise ConfigError(
            f"{key}: the tokenizer {name!r} has no {', '.join(missing)}; ALBERT pretraining needs [CLS], [SEP], "
            "[MASK] and padding tokens"
        )
    return tokenizer


def prepare_albert_dataset(
    inputs: Sequence[str],
    tokenizer: str,
    output: Path,
    *,
    max_seq_length: int = 512,
    num_proc: Optional[int] = None,
    validation_fraction: float = 0.01,
    dataset_config: Optional[str] = None,
    text_column: str = "text",
    cache_dir: Optional[str] = None,
    seed: int = 0,
    overwrite: bool = True,
    progress: bool = True,
) -> PrepareResult:
    """Build, tokenize and save the pairs; see the module docstring. Bad input raises ConfigError."""
    import datasets

    output = _checked_output(output)
    if not 0 <= validation_fraction < 1:
        raise ConfigError(f"--validation-fraction: {validation_fraction} is not in [0, 1)")
    if progress:
        datasets.enable_progress_bars()
    else:
        datasets.disable_progress_bars()

    tok = load_tokenizer(tokenizer)
    documents = _load_documents(list(inputs), dataset_config=dataset_config, text_column=text_column, cache_dir=cache_dir)
    documents = _with_validation_split(documents, validation_fraction, seed)
    started = time.time()
    pairs = _sentence_order_pairs(documents, tok, text_column, max_seq_length, seed, num_proc)
    cache_files = [f["filename"] for split in pairs.values() for f in split.cache_files]
    reused = bool(cache_files) and all(os.path.getmtime(path) < started for path in cache_files)

    manifest = dict(
        format=FORMAT,
        version=FORMAT_VERSION,
        max_seq_length=max_seq_length,
        vocab_size=len(tok),
        tokenizer=tokenizer,
        input=list(inputs),
        dataset_config=dataset_config,
        seed=seed,
        splits={name: len(split) for name, split in pairs.items()},
        created=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    )
    manifest["identity"] = data_identity(pairs, tok)
    written = _write(output, datasets.DatasetDict(pairs), tok, manifest, overwrite=overwrite)
    return PrepareResult(output=written, splits=manifest["splits"], reused_cache=reused, cache_files=cache_files,
                         identity=manifest["identity"])


IDENTITY_BATCH_ROWS = 4096


def data_identity(pairs, tokenizer) -> str:
    """sha256 of what the run trains on: every split's columns (their values and row boundaries, in order) and the
    tokenizer's definition. The same input, tokenizer and options give the same identity on any machine (unlike the
    saved files, whose metadata holds paths and cache fingerprints); the run names it (task.data.identity) so that
    a joiner's prepared copy is checked against it."""
    import numpy as np

    digest = hashlib.sha256()
    backend = getattr(tokenizer, "backend_tokenizer", None)
    digest.update((backend.to_str() if backend is not None else repr(sorted(tokenizer.get_vocab().items()))).encode())
    for name in sorted(pairs):
        digest.update(f"{name}:{len(pairs[name])}".encode())
        # the rows in order, a fixed number at a time (a split may not fit in memory; the batch size is part of what
        # is hashed, so it never changes)
        for batch in pairs[name].with_format("arrow").iter(batch_size=IDENTITY_BATCH_ROWS):
            for column in sorted(batch.column_names):
                values = batch.column(column).combine_chunks()
                digest.update(column.encode())
                if hasattr(values, "flatten"):  # a list column: its row lengths, then its values
                    lengths = values.value_lengths().to_numpy(zero_copy_only=False).astype(np.int64)
                    digest.update(lengths.tobytes())
                    values = values.flatten()
                digest.update(values.to_numpy(zero_copy_only=False).astype(np.int64).tobytes())
    return digest.hexdigest()


def _checked_output(output) -> Path:
    """The output directory, absolute; a file, or a directory of other things than an earlier output, is refused
    before any work (an earlier output is replaced)."""
    output = Path(output).expanduser().absolute()
    if output.exists() and not output.is_dir():
        raise ConfigError(f"--output: {output} is a file; pass a directory to write the prepared dataset into")
    if output.is_dir() and any(output.iterdir()) and not (output / MANIFEST).is_file():
        raise ConfigError(
            f"--output: {output} already holds other files; pass a new or empty directory (or an earlier output "
            "of swarmd prepare, which is replaced)"
        )
    return output


def _with_validation_split(documents, validation_fraction: float, seed: int):
    """The documents with a validation split: the input's own, or `validation_fraction` of its training documents."""
    import datasets

    if "validation" in documents or validation_fraction == 0:
        return documents
    if len(documents["train"]) < 2:
        raise ConfigError("--input: the text holds a single document; it cannot be split for validation")
    split = documents["train"].train_test_split(test_size=validation_fraction, seed=seed)
    return datasets.DatasetDict(train=split["train"], validation=split["test"])


def _sentence_order_pairs(documents, tok, text_column: str, max_seq_length: int, seed: int, num_proc) -> dict:
    """Each split's documents mapped to tokenized sentence-order pairs (datasets caches the map by fingerprint)."""
    import datasets

    features = datasets.Features(
        input_ids=datasets.Sequence(datasets.Value("int32")),
        token_type_ids=datasets.Sequence(datasets.Value("int8")),
        attention_mask=datasets.Sequence(datasets.Value("int8")),
        special_tokens_mask=datasets.Sequence(datasets.Value("int8")),
        sentence_order_label=datasets.Value("int8"),
    )
    builder = _PairBuilder(tok, text_column, max_seq_length, seed)
    pairs = {}
    for name in [n for n in ("train", "validation") if n in documents]:
        source = documents[name]
        pairs[name] = source.map(
            builder,
            batched=True,
            batch_size=256,
            with_indices=True,
            num_proc=min(num_proc, len(source)) if num_proc and num_proc > 1 and len(source) > 1 else None,
            remove_columns=source.column_names,
            features=features,
            new_fingerprint=_fingerprint(source, tok, text_column, max_seq_length, seed),
            desc=f"Sentence-order pairs ({name})",
        )
    if len(pairs["train"]) == 0:
        raise ConfigError(
            "--input: no sentence pairs could be built: documents need at least two sentences (separate documents "
            "by blank lines in text files)"
        )
    return pairs


def _load_documents(inputs: list[str], *, dataset_config, text_column: str, cache_dir):
    """Text files (one document per blank-line separated paragraph) or a datasets name (one document per row)."""
    import datasets

    files = _text_files(inputs)
    try:
        if files is not None:
            loaded = datasets.load_dataset(
                "text", data_files={"train": files}, sample_by="paragraph", cache_dir=cache_dir
            )
        else:
            loaded = datasets.load_dataset(inputs[0], dataset_config, cache_dir=cache_dir)
    except Exception as e:  # noqa: BLE001 - datasets raises many types for a missing or unreachable dataset
        what = "the text files" if files is not None else f"the dataset {inputs[0]!r}"
        raise ConfigError(
            f"--input: could not load {what} ({str(e).splitlines()[0][:200]}); pass text files or the name of a "
            "dataset that `datasets.load_dataset` can open here (with --dataset-config for its configuration)"
        ) from None
    if not isinstance(loaded, datasets.DatasetDict) or "train" not in loaded:
        raise ConfigError(f"--input: {inputs[0]!r} has no train split (it has: {', '.join(loaded)})")
    if text_column not in loaded["train"].column_names:
        raise ConfigError(
            f"--text-column: {inputs[0]!r} has no column {text_column!r} (it has: "
            f"{', '.join(loaded['train'].column_names)})"
        )
    return datasets.DatasetDict({name: loaded[name] for name in ("train", "validation") if name in loaded})


def _text_files(inputs: list[str]) -> Optional[list[str]]:
    """The files named by `inputs` (files, directories, globs); None if the single input is a dataset name."""
    files: list[str] = []
    for item in inputs:
        path = Path(item).expanduser()
        if path.is_file():
            files.append(str(path))
        elif path.is_dir():
            found = sorted(str(p) for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
            if not found:
                raise ConfigError(f"--input: the directory {path} holds no files")
            files.extend(found)
        elif any(c in item for c in "*?["):
            found = sorted(glob.glob(os.path.expanduser(item), recursive=True))
            if not found:
                raise ConfigError(f"--input: no file matches {item!r}")
            files.extend(found)
        elif len(inputs) == 1 and not item.startswith((".", "/", "~")) and not item.endswith((".txt", ".text")):
            return None  # a datasets name, e.g. wikitext with --dataset-config wikitext-103-raw-v1
        else:
            raise ConfigError(f"--input: {path} does not exist; pass text files, directories or a datasets name")
    return files


def _fingerprint(source, tokenizer, text_column: str, max_seq_length: int, seed: int) -> str:
    """An explicit cache key: datasets' own hashing of a tokenizer changes once it has been used."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        tokenizer_key = backend.to_str()
    else:
        from datasets.fingerprint import Hasher

        tokenizer_key = Hasher.hash(tokenizer)
    special = {attr: str(getattr(tokenizer, attr, None)) for attr in _SPECIAL_TOKENS}
    key = json.dumps(
        [FORMAT, FORMAT_VERSION, source._fingerprint, tokenizer_key, special, text_column, max_seq_length, seed]
    )
    return hashlib.sha256(key.encode()).hexdigest()[:32]


def _write(output: Path, pairs, tokenizer, manifest: dict, *, overwrite: bool) -> Path:
    """Write aside and rename into place, so a reader never sees half a dataset."""
    from swarmd import __version__

    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{output.name}.partial-", dir=output.parent))
    old = None
    try:
        pairs.save_to_disk(str(tmp / "dataset"))
        tokenizer.save_pretrained(str(tmp / "tokenizer"))
        (tmp / MANIFEST).write_text(json.dumps({**manifest, "swarmd_version": __version__}, indent=2) + "\n")
        if output.exists():
            if not overwrite and (output / MANIFEST).is_file():
                return output  # prepared meanwhile by another process: keep that one
            old = output.with_name(f".{output.name}.old-{os.getpid()}")
            os.rename(output, old)
        os.rename(tmp, output)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    return output
