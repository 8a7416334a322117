"""ALBERT pretraining (masked language modelling + sentence-order prediction) with transformers.

The defaults are the micro config: a ~0.1M-parameter ALBERT on a small corpus that swarmd generates, tokenizes and
prepares into the state dir on first start, which trains on a CPU in seconds. configs/albert-large-wikitext103.yaml
is the real run: albert-large-v2 on WikiText-103 prepared by `swarmd prepare albert`, LAMB, fp16.
This module stays light; transformers and datasets are imported when the task is prepared and built.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional

from pydantic import Field, model_validator

from swarmd.config.schema import StrictModel
from swarmd.errors import ConfigError
from swarmd.tasks.base import StepOutput, Task
from swarmd.tasks.optim import OptimConfig, build_optimizer, build_scheduler

__all__ = ["AlbertTask", "AlbertSettings"]


class AlbertModelConfig(StrictModel):
    name: str = Field(
        "albert-large-v2",
        description="albert-base-v2 or albert-large-v2 (built in, no download), or a directory or Hugging Face hub "
        "name whose config.json is already on this machine. The vocabulary size always follows the tokenizer.",
    )
    embedding_size: Optional[int] = Field(32, ge=8, description="null: the named config's own (same below).")
    hidden_size: Optional[int] = Field(64, ge=8)
    num_hidden_layers: Optional[int] = Field(2, ge=1)
    num_attention_heads: Optional[int] = Field(2, ge=1)
    intermediate_size: Optional[int] = Field(128, ge=8)
    max_position_embeddings: Optional[int] = Field(128, ge=16)
    vocab_size: Optional[int] = Field(
        None, ge=2, description="Null: the prepared tokenizer's. Auxiliary peers do not read the prepared data, so "
        "with source: prepared they need it (the trainers' tokenizer size).",
    )
    dropout: Optional[float] = Field(None, ge=0, lt=1, description="Hidden and attention dropout (ALBERT v2: 0).")
    attention: Literal["sdpa", "eager"] = Field(
        "sdpa", description="sdpa: torch's scaled_dot_product_attention (fused kernels); eager: plain matmuls."
    )
    activation_checkpointing: bool = Field(
        False, description="Recompute each transformer layer in backward instead of keeping its activations."
    )

    @model_validator(mode="after")
    def _check_heads(self) -> "AlbertModelConfig":
        if self.hidden_size and self.num_attention_heads and self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not a multiple of num_attention_heads {self.num_attention_heads}"
            )
        return self


class GeneratedCorpusConfig(StrictModel):
    documents: int = Field(2000, ge=20, description="Generated documents (4-8 sentences each).")
    vocab_size: int = Field(1000, ge=100, description="Size of the WordPiece vocabulary trained on them.")
    max_seq_length: int = Field(64, ge=16, description="Tokens per sentence pair.")
    seed: int = 0


class AlbertDataConfig(StrictModel):
    source: Literal["prepared", "generated"] = Field(
        "generated",
        description="prepared: the output directory of `swarmd prepare albert`; generated: a small synthetic corpus "
        "that swarmd writes, tokenizes and prepares itself (micro runs, tests).",
    )
    path: Optional[str] = Field(
        None,
        description="prepared: the `swarmd prepare albert --output` directory. generated: where to put it (default "
        "<state_dir>/data), so several local peers can share one copy.",
    )
    generated: GeneratedCorpusConfig = Field(default_factory=GeneratedCorpusConfig)
    prepare: Optional[str] = Field(
        None, max_length=2000, pattern=r"^swarmd prepare albert ",
        description="prepared: the exact `swarmd prepare albert ... --output DIR` command that makes the run's data "
        "(`swarmd prepare` prints it); run-wide, so a joiner from the run's manifest that lacks the data is told it.",
    )
    identity: Optional[str] = Field(
        None, pattern=r"^[0-9a-f]{64}$",
        description="prepared: the data's identity (`swarmd prepare` prints it: a sha256 of the pairs and the "
        "tokenizer); a peer whose prepared data differs refuses to start (exit 2) rather than train on other data.",
    )
    mlm_probability: float = Field(0.15, gt=0, lt=1, description="Fraction of tokens masked for MLM.")
    num_workers: int = Field(0, ge=0, description="DataLoader worker processes (masking and padding run there).")
    pad_to_multiple_of: Optional[int] = Field(8, ge=1, description="Pad batches to a multiple of this (tensor cores).")

    @model_validator(mode="after")
    def _check_source(self) -> "AlbertDataConfig":
        if self.source == "prepared" and not self.path:
            if self.prepare:  # a joiner from the run's manifest: the path is each machine's own
                raise ValueError(
                    f"data.source is prepared but data.path is not set; prepare the run's data with `{self.prepare}` "
                    "and pass --set task.data.path=DIR (or join with --auxiliary to average without training)"
                )
            raise ValueError(
                "data.source is prepared but data.path is not set; point it at the output of "
                "`swarmd prepare albert --output DIR`"
            )
        return self


def _micro_optim() -> OptimConfig:
    # LAMB with linear warm-up and decay as in the real run (configs/albert-large-wikitext103.yaml has hivemind's
    # ALBERT values: lr 0.00176, wd 0.01, eps 1e-6, clipping at 1.0); LAMB's steps are relative to the weight norm,
    # so a micro model needs a larger rate to move within a few global epochs.
    return OptimConfig(
        name="lamb", lr=0.05, weight_decay=0.01, eps=1e-6, max_grad_norm=1.0, schedule="linear",
        warmup_epochs=2, total_epochs=300,
    )


class AlbertSettings(StrictModel):
    model: AlbertModelConfig = Field(default_factory=AlbertModelConfig)
    data: AlbertDataConfig = Field(default_factory=AlbertDataConfig)
    optim: OptimConfig = Field(default_factory=_micro_optim)
    eval_every_epochs: int = Field(
        0, ge=0, description="MLM and SOP accuracy on the validation split every N global epochs; 0: never."
    )
    eval_max_batches: int = Field(20, ge=1, description="Bound on the batches one evaluation reads.")


class AlbertTask(Task):
    name = "albert"
    description = "ALBERT pretraining (MLM + sentence-order prediction) with transformers"
    Config = AlbertSettings
    settings: AlbertSettings

    def prepare(self) -> None:
        from swarmd.tasks.albert import prepared

        data = self.settings.data
        if data.source == "generated":
            from swarmd.tasks.albert.corpus import ensure_generated_dataset

            generated = data.generated
            root = ensure_generated_dataset(
                Path(data.path).expanduser() if data.path else self.context.data_dir,
                documents=generated.documents,
                vocab_size=generated.vocab_size,
                max_seq_length=generated.max_seq_length,
                seed=generated.seed,
            )
        else:
            root = Path(data.path).expanduser()
        self.prepared = prepared.open_prepared(root, key="task.data.path", prepare=data.prepare, identity=data.identity)
        positions = self.settings.model.max_position_embeddings
        if positions is not None and positions < self.prepared.max_seq_length:
            raise ConfigError(
                f"task.model.max_position_embeddings: {positions} is shorter than the prepared sequences "
                f"({self.prepared.max_seq_length} tokens in {root}); raise it or prepare shorter sequences"
            )
        configured = self.settings.model.vocab_size
        if configured is not None and configured != self.prepared.vocab_size:
            raise ConfigError(
                f"task.model.vocab_size: {configured}, but the tokenizer in {root} has {self.prepared.vocab_size}; "
                "leave it unset or make them agree"
            )
        self.vocab_size = self.prepared.vocab_size
        pairs = self.prepared.splits.get("train", 0)
        if pairs < self.context.batch_size:
            raise ConfigError(
                f"training.batch_size: {self.context.batch_size} is more than the {pairs} training pairs in {root}; "
                "lower it or prepare more text"
            )

    def build_model(self):
        from swarmd.tasks.albert.model import build_albert

        return build_albert(self.settings.model, vocab_size=self.vocab_size)

    def prepare_auxiliary(self) -> None:
        if self.settings.model.vocab_size is not None:
            self.vocab_size = self.settings.model.vocab_size
        elif self.settings.data.source == "generated":
            self.prepare()  # generated here, from the settings: nothing anyone has to provide
        else:
            raise ConfigError(
                "task.model.vocab_size: an auxiliary peer does not read the prepared data, so it cannot read the "
                "tokenizer's size; set it to the trainers' vocabulary size"
            )

    def parameter_groups(self, model):
        from swarmd.tasks.albert.model import weight_decay_groups

        return weight_decay_groups(model, self.settings.optim.weight_decay)

    def build_optimizer(self, param_groups):
        return build_optimizer(self.settings.optim, param_groups)

    def build_scheduler(self, optimizer):
        return build_scheduler(self.settings.optim, optimizer)

    def train_batches(self, seed: int):
        from swarmd.tasks.albert import data

        return data.train_batches(self, seed)

    def resume_batches(self, seed: int, consumed: int):
        from swarmd.tasks.albert import data

        return data.train_batches(self, seed, skip=consumed)

    def training_step(self, model, batch) -> StepOutput:
        from swarmd.tasks.albert import data

        return data.training_step(model, batch)

    def evaluate(self, model) -> dict[str, float]:
        from swarmd.tasks.albert import data

        return data.evaluate(self, model)

    def export_model(self, model, directory: Path) -> dict:
        """The Hugging Face layout: save_pretrained's config.json and weights, and the tokenizer it trained with."""
        model.save_pretrained(str(directory), safe_serialization=True)
        self.prepared.tokenizer().save_pretrained(str(directory))
        return {
            "format": "transformers",
            "class": "transformers.AlbertForPreTraining",
            "load": "transformers.AlbertForPreTraining.from_pretrained(DIR)",
            "tokenizer": "transformers.AutoTokenizer.from_pretrained(DIR)",
        }
