"""`swarmd prepare albert`: well-formed sentence-order pairs on disk, the datasets cache on re-runs, one-line errors."""

import json
import os

import pytest

from daemons import run_cli


def test_prepare_writes_sentence_order_pairs(albert_prepared):
    result = albert_prepared.first_run
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Tokenization: done" in result.stdout
    output = albert_prepared.output
    manifest = json.loads((output / "swarmd-prepared.json").read_text())
    assert manifest["max_seq_length"] == 64 and manifest["splits"]["train"] > 400 and manifest["splits"]["validation"] > 0

    from swarmd.tasks.albert.prepared import open_prepared

    prepared = open_prepared(output, key="test")
    tokenizer = prepared.tokenizer()
    assert prepared.vocab_size == len(tokenizer)
    train = prepared.split("train")
    assert len(train) == manifest["splits"]["train"]
    labels = set()
    for row in train.select(range(50)):
        ids, types, special = row["input_ids"], row["token_type_ids"], row["special_tokens_mask"]
        assert len(ids) <= 64 and ids[0] == tokenizer.cls_token_id and ids[-1] == tokenizer.sep_token_id
        sep = ids.index(tokenizer.sep_token_id)  # [CLS] A [SEP] B [SEP]: segment B has token type 1
        assert types == [0] * (sep + 1) + [1] * (len(ids) - sep - 1)
        assert [i for i, flag in enumerate(special) if flag] == [0, sep, len(ids) - 1]
        assert row["attention_mask"] == [1] * len(ids)
        if len(ids) < 64:  # not truncated: both segments end where a sentence ends
            a, b = tokenizer.decode(ids[1:sep]), tokenizer.decode(ids[sep + 1 : -1])
            assert a.endswith((".", "!", "?")) and b.endswith((".", "!", "?")), (a, b)
        labels.add(row["sentence_order_label"])
    assert labels == {0, 1}


def test_rerunning_reads_the_datasets_cache(albert_prepared):
    assert albert_prepared.first_run.returncode == 0, albert_prepared.first_run.stderr[-3000:]
    cache_files = sorted((albert_prepared.work / "cache").rglob("cache-*.arrow"))
    assert cache_files
    mtimes = [os.path.getmtime(path) for path in cache_files]
    again = run_cli(*albert_prepared.args, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "Tokenization: reused the datasets cache" in again.stdout
    assert [os.path.getmtime(path) for path in cache_files] == mtimes  # nothing was written again
    assert sorted((albert_prepared.work / "cache").rglob("cache-*.arrow")) == cache_files
    first_line = albert_prepared.first_run.stdout.splitlines()[0]
    assert again.stdout.splitlines()[0] == first_line  # the same pairs, written again to --output
    identity = [line for line in albert_prepared.first_run.stdout.splitlines() if line.startswith("Data identity:")]
    assert identity and identity[0] in again.stdout  # the same data, the same identity


def test_the_run_names_its_data_and_a_joiner_is_told_the_command_or_refused_other_data(albert_prepared, tmp_path):
    """task.data.prepare and task.data.identity (run-wide: in the run's manifest): `swarmd prepare` prints both; a
    joiner without the data is told the run's command (and --auxiliary), one whose data differs is refused."""
    from swarmd.errors import ConfigError
    from swarmd.tasks.albert import AlbertDataConfig
    from swarmd.tasks.albert.prepared import open_prepared

    out = albert_prepared.first_run.stdout
    manifest = json.loads((albert_prepared.output / "swarmd-prepared.json").read_text())
    identity = manifest["identity"]
    assert len(identity) == 64 and f"Data identity: {identity}" in out
    line = next(line for line in out.splitlines() if line.startswith("For the run's config"))
    command = json.loads(line.split("task.data.prepare: ")[1].split(", task.data.identity")[0])
    assert command.startswith("swarmd prepare albert --input ") and command.endswith("--output DIR")
    assert "--num-proc" not in command and "--cache-dir" not in command  # each machine's own

    assert open_prepared(albert_prepared.output, key="task.data.path", identity=identity).identity == identity
    with pytest.raises(ConfigError, match=r"task.data.identity: the run trains on data 000000000000\.\.\., .* holds "
                       rf"data {identity[:12]}\.\.\.; prepare the run's data with `swarmd prepare albert"):
        open_prepared(albert_prepared.output, key="task.data.path", prepare=command, identity="0" * 64)
    missing = tmp_path / "none"
    with pytest.raises(ConfigError) as told:
        open_prepared(missing, key="task.data.path", prepare=command, identity=identity)
    assert f"--output {missing}`" in str(told.value) and "--auxiliary" in str(told.value)
    with pytest.raises(ValueError, match="prepare the run's data with `swarmd prepare albert .*--set task.data.path"):
        AlbertDataConfig(source="prepared", prepare=command, identity=identity)  # a joiner: no path of its own
    with pytest.raises(ValueError):
        AlbertDataConfig(source="prepared", path="/data", prepare="rm -rf /")  # only a swarmd prepare command


@pytest.mark.parametrize(
    "change, fragment",
    [
        ({"--tokenizer": "/no/such/tokenizer"}, "--tokenizer: /no/such/tokenizer does not exist"),
        ({"--tokenizer": "CORPUS"}, "--tokenizer: cannot load a tokenizer from"),
        ({"--input": "/no/such/corpus.txt"}, "--input: /no/such/corpus.txt does not exist"),
        ({"--output": "CORPUS"}, "already holds other files"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(albert_prepared, tmp_path, change, fragment):
    args = list(albert_prepared.args)
    for flag, value in change.items():
        args[args.index(flag) + 1] = str(albert_prepared.work / "corpus") if value == "CORPUS" else value
    if "--output" not in change:
        args[args.index("--output") + 1] = str(tmp_path / "out")
    result = run_cli(*args, timeout=120)
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("swarmd: error: "), result.stderr[-3000:]
    assert fragment in result.stderr
    assert not (tmp_path / "out").exists()
