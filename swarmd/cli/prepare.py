"""`swarmd prepare albert`: the tokenized sentence-order-prediction dataset the ALBERT task trains on."""

from __future__ import annotations

import json
import os
import shlex
from typing import Optional

import typer

__all__ = ["app"]

app = typer.Typer(help="Prepare a task's training data.", no_args_is_help=True, add_completion=False)


@app.command("albert")
def albert(
    inputs: list[str] = typer.Option(
        ...,
        "--input",
        "-i",
        help="Text files, directories or globs (one document per blank-line separated paragraph), or a datasets "
        "name such as wikitext (one document per row). Repeatable.",
    ),
    tokenizer: str = typer.Option(
        ..., "--tokenizer", help="A tokenizer directory (written by save_pretrained) or a hub name, e.g. albert-large-v2."
    ),
    output: str = typer.Option(..., "--output", "-o", help="Directory to write; the task's task.data.path."),
    dataset_config: Optional[str] = typer.Option(
        None, "--dataset-config", help="Configuration of a datasets input, e.g. wikitext-103-v1."
    ),
    text_column: str = typer.Option("text", "--text-column", help="Column holding the text of a datasets input."),
    max_seq_length: int = typer.Option(512, "--max-seq-length", min=16, help="Tokens per sentence pair."),
    num_proc: Optional[int] = typer.Option(
        None, "--num-proc", min=1, help="Parallel tokenization processes (default: all CPUs)."
    ),
    validation_fraction: float = typer.Option(
        0.01, "--validation-fraction", help="Documents held out for evaluation when the input has no validation split."
    ),
    cache_dir: Optional[str] = typer.Option(
        None, "--cache-dir", help="datasets cache directory (default: HF_DATASETS_CACHE, ~/.cache/huggingface/datasets)."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the pair cuts and swaps, and of the validation split."),
) -> None:
    """Build sentence-order pairs, tokenize them in parallel (cached on disk) and save them with save_to_disk.

    Re-running with the same input, tokenizer and options reads the datasets cache instead of tokenizing again.
    """
    from huggingface_hub.utils import logging as hub_logging

    from swarmd.tasks.albert.prepare import prepare_albert_dataset

    # huggingface_hub logs every failed request and retry on a line of its own; a failure is reported once, below
    hub_logging.set_verbosity_error()
    result = prepare_albert_dataset(
        inputs,
        tokenizer,
        output,
        max_seq_length=max_seq_length,
        num_proc=num_proc or os.cpu_count(),
        validation_fraction=validation_fraction,
        dataset_config=dataset_config,
        text_column=text_column,
        cache_dir=cache_dir,
        seed=seed,
    )
    counts = ", ".join(f"{count} {name}" for name, count in result.splits.items())
    print(f"Prepared {counts} sentence pairs of up to {max_seq_length} tokens in {result.output}")
    if result.reused_cache:
        print(f"Tokenization: reused the datasets cache ({os.path.dirname(result.cache_files[0])})")
    elif result.cache_files:
        print(f"Tokenization: done; cached in {os.path.dirname(result.cache_files[0])} for the next run")
    print(f"Train on it with: task: {{name: albert, data: {{source: prepared, path: {result.output}}}}}")
    command = run_command(inputs, tokenizer, dataset_config, text_column, max_seq_length, validation_fraction, seed)
    print(f"Data identity: {result.identity}\nFor the run's config (joiners are told the command and checked against "
          f"the identity): task.data.prepare: {json.dumps(command)}, task.data.identity: {result.identity}")


def run_command(inputs, tokenizer, dataset_config, text_column, max_seq_length, validation_fraction, seed) -> str:
    """The `swarmd prepare albert` command a run founded on this data carries in its manifest (task.data.prepare),
    so that joiners prepare the same data: without the options that change only where and how fast (--num-proc,
    --cache-dir: each machine's own), and with `--output DIR` for the joiner to fill in."""
    return shlex.join([
        "swarmd", "prepare", "albert", *(arg for item in inputs for arg in ("--input", item)), "--tokenizer", tokenizer,
        *(["--dataset-config", dataset_config] if dataset_config else []), "--text-column", text_column,
        "--max-seq-length", str(max_seq_length), "--validation-fraction", str(validation_fraction), "--seed",
        str(seed), "--output", "DIR",
    ])
