"""The ALBERT task: sentence-order pairs, the model options, training on a prepared dataset, and bad input."""

import random

import pytest
import torch
import yaml

from swarmd.config import load_config
from swarmd.errors import ConfigError
from swarmd.tasks.albert import AlbertSettings, AlbertTask
from swarmd.tasks.albert.model import build_albert
from swarmd.tasks.albert.prepare import sentence_order_pairs, split_sentences
from swarmd.tasks.base import TaskContext


def albert_task(tmp_path, batch_size=16, **settings) -> AlbertTask:
    return AlbertTask(AlbertSettings.model_validate(settings), TaskContext(tmp_path, torch.device("cpu"), "fp32", batch_size, 0))


def test_sentences_are_split_at_terminal_punctuation():
    text = "Ada woke up early. Then it rained!  Did Bruno see it? 3 dogs barked. \"Go home,\" said Ada."
    assert split_sentences(text) == [
        "Ada woke up early.", "Then it rained!", "Did Bruno see it?", "3 dogs barked.", "\"Go home,\" said Ada."
    ]
    assert split_sentences("No end in sight e.g. here") == ["No end in sight e.g. here"]


def test_pairs_cut_chunks_at_sentence_boundaries_and_swap_half_of_them():
    rng = random.Random(0)
    swapped = 0
    for _ in range(300):
        sentences = [f"S{i}." for i in range(7)]
        pairs = sentence_order_pairs(sentences, [10] * 7, target=25, rng=rng)
        # chunks close once they hold >= 25 tokens: S0-S2, S3-S5; the lone S6 cannot make a pair
        assert len(pairs) == 2
        for (a, b, label), chunk in zip(pairs, (sentences[:3], sentences[3:6])):
            first, second = (b, a) if label else (a, b)
            assert f"{first} {second}" == " ".join(chunk) and a and b
            swapped += label
    assert 0.4 < swapped / 600 < 0.6


def test_activation_checkpointing_recomputes_each_layer_with_the_same_gradients():
    settings = AlbertSettings().model
    models, calls = [], []
    for checkpointing in (False, True):
        torch.manual_seed(0)
        model = build_albert(settings.model_copy(update={"activation_checkpointing": checkpointing}), vocab_size=100)
        layer, counter = model.albert.encoder.albert_layer_groups[0].albert_layers[0], [0]
        forward = layer.forward
        layer.forward = lambda *args, **kwargs: (counter.append(1), forward(*args, **kwargs))[1]
        model(**_random_batch()).loss.backward()
        models.append(model)
        calls.append(len(counter) - 1)
    layers = settings.num_hidden_layers  # one shared layer group, run once per layer
    assert calls == [layers, 2 * layers]  # checkpointing runs every layer again in backward
    for plain, checkpointed in zip(*(m.parameters() for m in models)):
        torch.testing.assert_close(plain.grad, checkpointed.grad, rtol=1e-5, atol=1e-6)


def test_sdpa_and_eager_attention_compute_the_same_outputs():
    outputs = []
    for attention in ("sdpa", "eager"):
        torch.manual_seed(0)
        model = build_albert(AlbertSettings().model.model_copy(update={"attention": attention}), vocab_size=100)
        assert model.config._attn_implementation == attention
        model.eval()
        with torch.no_grad():
            outputs.append(model(**_random_batch()).prediction_logits)
    torch.testing.assert_close(outputs[0], outputs[1], rtol=1e-4, atol=1e-5)


def test_the_task_trains_on_a_prepared_dataset(tmp_path, albert_prepared):
    assert albert_prepared.first_run.returncode == 0, albert_prepared.first_run.stderr
    task = albert_task(tmp_path, data={"source": "prepared", "path": str(albert_prepared.output)})
    task.prepare()
    torch.manual_seed(0)
    model = task.build_model()
    assert model.config.vocab_size == task.prepared.vocab_size == len(task.prepared.tokenizer())
    optimizer = task.build_optimizer(task.parameter_groups(model))
    scheduler = task.build_scheduler(optimizer)
    task.set_epoch(0)
    batches = task.train_batches(seed=1)
    losses = []
    for _ in range(24):
        output = task.training_step(model, next(batches))
        output.loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
        losses.append(output.loss.item())
    assert set(output.metrics) == {"mlm_accuracy", "sop_accuracy"}
    assert sum(losses[-4:]) / 4 < sum(losses[:4]) / 4 - 0.3, losses
    evaluation = task.evaluate(model)
    assert set(evaluation) == {"val_loss", "mlm_accuracy", "sop_accuracy", "val_samples"}
    assert evaluation["val_samples"] == task.prepared.splits["validation"]
    assert task.evaluate(model) == evaluation  # the same masks every time: evaluations are comparable


def test_masks_follow_the_data_seed(tmp_path, albert_prepared):
    task = albert_task(tmp_path, data={"source": "prepared", "path": str(albert_prepared.output)})
    task.prepare()
    first, again, other = (next(iter(task.train_batches(seed))) for seed in (5, 5, 6))
    assert torch.equal(first["labels"], again["labels"]) and torch.equal(first["input_ids"], again["input_ids"])
    assert not torch.equal(first["input_ids"], other["input_ids"])
    masked = first["labels"] != -100
    assert 0.05 < masked.float().sum() / first["attention_mask"].sum() < 0.3  # mlm_probability 0.15 of real tokens


def test_missing_or_foreign_prepared_data_is_a_config_error(tmp_path):
    task = albert_task(tmp_path, data={"source": "prepared", "path": str(tmp_path / "nowhere")})
    with pytest.raises(ConfigError, match=r"task\.data\.path: .*nowhere does not exist; create it with `swarmd prepare albert"):
        task.prepare()
    (tmp_path / "other").mkdir()
    task = albert_task(tmp_path, data={"source": "prepared", "path": str(tmp_path / "other")})
    with pytest.raises(ConfigError, match=r"task\.data\.path: .* is not a prepared ALBERT dataset"):
        task.prepare()


def test_a_model_or_batch_that_does_not_fit_the_prepared_data_is_a_config_error(tmp_path, albert_prepared):
    data = {"source": "prepared", "path": str(albert_prepared.output)}
    task = albert_task(tmp_path, data=data, model={"max_position_embeddings": 32})
    with pytest.raises(ConfigError, match=r"task\.model\.max_position_embeddings: 32 is shorter than the prepared"):
        task.prepare()
    task = albert_task(tmp_path, batch_size=100_000, data=data)
    with pytest.raises(ConfigError, match=r"training\.batch_size: 100000 is more than the \d+ training pairs"):
        task.prepare()


def test_config_names_and_settings_are_checked(tmp_path):
    settings = AlbertSettings().model.model_copy(update={"name": "no-such-albert"})
    with pytest.raises(ConfigError, match=r"task\.model\.name: 'no-such-albert' is not in the local cache"):
        build_albert(settings, vocab_size=100)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"task": {"name": "albert", "data": {"source": "prepared"}}}))
    with pytest.raises(ConfigError, match=r"task\.data: data\.source is prepared but data\.path is not set"):
        load_config(path, environ={})
    path.write_text(yaml.safe_dump({"task": {"name": "albert", "model": {"hidden_size": 66, "num_attention_heads": 4}}}))
    with pytest.raises(ConfigError, match=r"task\.model: hidden_size 66 is not a multiple of num_attention_heads 4"):
        load_config(path, environ={})


def _random_batch(batch=4, length=24, vocab=100):
    generator = torch.Generator().manual_seed(1)
    attention = torch.ones(batch, length, dtype=torch.long)
    attention[0, length // 2 :] = 0  # one padded sequence, so the attention mask matters
    labels = torch.randint(0, vocab, (batch, length), generator=generator)
    labels[torch.rand(batch, length, generator=generator) > 0.15] = -100
    return dict(
        input_ids=torch.randint(5, vocab, (batch, length), generator=generator),
        token_type_ids=(torch.arange(length) >= length // 3).long().expand(batch, length),
        attention_mask=attention,
        labels=labels,
        sentence_order_label=torch.tensor([0, 1, 1, 0]),
    )
