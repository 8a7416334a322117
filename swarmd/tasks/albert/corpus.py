"""A small generated text corpus and WordPiece tokenizer, for the micro config and the tests (no hub access).

Each document is a short story told in a fixed order of stages ("woke up", "walked to", "met", ..., "fell
asleep"), with names, places and objects drawn at random and repeated within the story. So the sentence order is
learnable (sentence-order prediction), and so are the masked words (a name or object seen earlier in the story).
`ensure_generated_dataset` writes the corpus, trains the tokenizer with `tokenizers` and runs the same preparation
as `swarmd prepare albert`, once: later starts reuse the directory.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import shutil
import tempfile
from pathlib import Path

__all__ = ["generate_documents", "write_corpus", "train_tokenizer", "ensure_generated_dataset"]

logger = logging.getLogger(__name__)

_NAMES = "Ada Bruno Clara Dmitri Elena Farid Greta Hugo Ines Jonas Kira Luca Mira Nils Olga Pavel Rosa Sami Tara Umar"
_PLACES = "market harbour library forest station garden bakery museum river castle school village bridge tower farm"
_OBJECTS = "lantern map basket violin letter compass kettle ladder blanket hammer mirror candle bicycle rope drum"
_ADJECTIVES = "old red heavy tiny broken shiny wooden strange green quiet"
_STAGES = [
    ["{a} woke up early near the {home}.", "Early in the morning {a} left the {home}."],
    ["The sky over the {home} was grey and cold.", "It was a warm day near the {home}."],
    ["{a} took a {adj} {thing} and walked to the {place}.", "Carrying a {adj} {thing}, {a} went to the {place}."],
    ["At the {place}, {a} met {b}.", "{b} was already waiting at the {place}."],
    ["{b} had lost a {other} somewhere in the {place}.", "{b} needed a {other} but could not find one."],
    ["{a} and {b} searched the {place} for the {other}.", "Together they looked everywhere for the {other}."],
    ["After an hour, {b} found the {other} under the {thing}.", "At last the {other} turned up next to the {thing}."],
    ["{b} thanked {a} and gave back the {adj} {thing}.", "To say thanks, {b} shared lunch with {a}."],
    ["In the evening {a} walked home to the {home}.", "When it got dark, {a} returned to the {home}."],
    ["Finally, {a} fell asleep thinking about the {other}.", "That night {a} dreamt of the {place} and the {other}."],
]
SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def generate_documents(count: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    names, places, objects = _NAMES.split(), _PLACES.split(), _OBJECTS.split()
    documents = []
    for _ in range(count):
        a, b = rng.sample(names, 2)
        home, place = rng.sample(places, 2)
        thing, other = rng.sample(objects, 2)
        words = dict(a=a, b=b, home=home, place=place, thing=thing, other=other, adj=rng.choice(_ADJECTIVES.split()))
        stages = sorted(rng.sample(range(len(_STAGES)), rng.randint(4, 8)))
        documents.append(" ".join(rng.choice(_STAGES[stage]).format(**words) for stage in stages))
    return documents


def write_corpus(directory: Path, documents: list[str], files: int = 2) -> list[str]:
    """Text files with one document per paragraph (documents separated by a blank line)."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for index in range(files):
        path = directory / f"corpus-{index:02d}.txt"
        path.write_text("\n\n".join(documents[index::files]) + "\n")
        paths.append(str(path))
    return paths


def train_tokenizer(files: list[str], vocab_size: int, output: Path) -> Path:
    """A BERT-style WordPiece tokenizer trained on `files`, saved with save_pretrained() into `output`."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False)
    tokenizer.train(files, trainer)
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_input_names=["input_ids", "token_type_ids", "attention_mask"],
    )
    wrapped.save_pretrained(str(output))
    return output


def ensure_generated_dataset(root: Path, *, documents: int, vocab_size: int, max_seq_length: int, seed: int) -> Path:
    """A prepared dataset of the generated corpus under `root`, made on first use (a few seconds)."""
    from swarmd.tasks.albert.prepare import prepare_albert_dataset
    from swarmd.tasks.albert.prepared import MANIFEST

    spec = dict(documents=documents, vocab_size=vocab_size, max_seq_length=max_seq_length, seed=seed, version=1)
    key = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]
    target = root / f"albert-generated-{key}"
    if (target / MANIFEST).is_file():
        return target
    logger.info("Generating the ALBERT corpus (%d documents) and its tokenizer into %s", documents, target)
    root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".albert-generated-", dir=root))
    try:
        files = write_corpus(work / "corpus", generate_documents(documents, seed))
        train_tokenizer(files, vocab_size, work / "tokenizer")
        prepare_albert_dataset(
            files,
            str(work / "tokenizer"),
            target,
            max_seq_length=max_seq_length,
            num_proc=1,
            validation_fraction=0.05,
            cache_dir=str(work / "cache"),
            seed=seed,
            overwrite=False,
            progress=False,
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target
