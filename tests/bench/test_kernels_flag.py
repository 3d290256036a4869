"""bench/kernels_flag.py: the --kernels option of the bench scripts without a config sets the same process-wide
paths train.py sets from config section kernels, gives a Generator the switches r1/actor.py gives it, and refuses
an unknown key or value in one line."""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from bench import kernels_flag  # noqa: E402
from kernels import attention  # noqa: E402
from r1.model import OPS  # noqa: E402


@pytest.fixture(autouse=True)
def default_paths():
    yield
    kernels_flag.use([])


def test_words_set_the_process_paths_and_the_generator_switches():
    k = kernels_flag.use(["attention=sdpa", "kernels.fa4=false", "fuse_train=true", "fuse=false", "sample=torch",
                          "launch_ahead=false"])
    assert (attention.PATHS.attention, attention.PATHS.fa4, OPS.fuse_train) == ("sdpa", False, True)
    assert kernels_flag.generator(k) == {"fuse": False, "overlap": False, "mix": None, "chunk_graphs": True,
                                         "triton_sample": False}
    assert kernels_flag.words(k) == {"fuse": False, "fuse_train": True, "launch_ahead": False, "sample": "torch",
                                     "attention": "sdpa", "fa4": False}
    k = kernels_flag.use([])
    assert (attention.PATHS.attention, attention.PATHS.fa4, OPS.fuse_train) == ("", True, False)
    assert kernels_flag.words(k) == {}


@pytest.mark.parametrize("word, culprit", [("fuze=false", "kernels.fuze"), ("sample=fast", "kernels.sample"),
                                           ("fuse", "kernels.fuse")])
def test_a_wrong_word_is_one_line_naming_it(word, culprit):
    with pytest.raises(SystemExit) as e:
        kernels_flag.use([word])
    assert str(e.value).startswith("error: --kernels: ") and culprit in str(e.value) and "\n" not in str(e.value)


def test_agent_rollout_refuses_a_wrong_kernels_word_before_any_work():
    from bench import agent_rollout

    with pytest.raises(SystemExit) as e:
        agent_rollout.main(["--kernels", "chunk_graph=false"])
    assert "kernels.chunk_graph" in str(e.value)
