"""data.val_size: a validation split carved from the train rows, fixed across seeds, never trained on."""
import os

import pytest

from r1.config import ConfigError, load_config
from r1.tasks.data import load_rows

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOKE = os.path.join(ROOT, "configs", "smoke.yaml")


def _ids(rows):
    return [r["id"] for r in rows]


def test_val_is_carved_from_train_and_fixed_across_seeds():
    cfg = load_config(SMOKE, ["data.task=gsm8k_tool", "data.train_size=0", "data.val_size=500"])
    train, val = load_rows(cfg, "train"), load_rows(cfg, "val")
    assert (len(train), len(val)) == (7473 - 500, 500)
    assert not set(_ids(train)) & set(_ids(val))
    assert all(i.startswith("gsm8k-train-") for i in _ids(val))
    other = load_config(SMOKE, ["data.task=gsm8k_tool", "data.train_size=0", "data.val_size=500", "run.seed=7"])
    assert _ids(load_rows(other, "val")) == _ids(val)  # the same problems whatever the seed
    # rows keep the file's order, so an eval.limit prefix of val is a prefix of the same problems
    order = [int(i.rsplit("-", 1)[1]) for i in _ids(val)]
    assert order == sorted(order)
    assert _ids(load_rows(cfg, "test")) == _ids(load_rows(load_config(SMOKE, ["data.task=gsm8k_tool"]), "test"))


def test_no_val_size_leaves_train_as_it_was():
    base = load_config(SMOKE, ["data.task=gsm8k_tool"])
    assert len(load_rows(base, "train")) == 64
    with pytest.raises(ValueError, match="data.val_size"):
        load_rows(base, "val")


def test_val_without_val_size_is_a_config_error():
    with pytest.raises(ConfigError, match="eval.split.*data.val_size"):
        load_config(SMOKE, ["eval.split=val"])


def test_val_size_that_leaves_nothing_to_train_on():
    cfg = load_config(SMOKE, ["data.task=gsm8k_tool", "data.val_size=64"])  # smoke caps train at 64
    with pytest.raises(ValueError, match="data.val_size=64 leaves no training rows"):
        load_rows(cfg, "train")
