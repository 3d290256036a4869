"""bench/fp8_matmul.py on the CPU (its small dry-run shapes): every row is timed, the FP8 path computes the same
product as bf16 within FP8's rounding (a wrong scale or a transposed operand would be off by order one), and bad
arguments get one line. On the CPU `_scaled_mm` takes a row-major second operand too: the CUDA layout rule is
checked by the benchmark's GPU run, not here."""
import json

import pytest

from bench import fp8_matmul


def test_fp8_matmul_rows_are_timed_and_close_to_the_reference(tmp_path):
    out = tmp_path / "fp8.json"
    assert fp8_matmul.main(["--reps", "1", "--device", "cpu", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    shapes = [r for r in rows if r["name"] == "fp8_matmul"]
    assert len(shapes) == 2 and rows[-1]["name"] == "fp8_matmul_layer"
    for r in shapes:
        assert r["bf16_ms"] > 0 and r["fp8_kernel_ms"] > 0 and r["fp8_with_quant_ms"] > 0
        assert r["err_bf16"] < 1e-2  # bf16 operands, float32 accumulation: ~2e-3
        assert r["err_fp8"] < 0.08  # e4m3 keeps 3 mantissa bits: ~3e-2 with per-row scales
        assert r["err_fp8"] > r["err_bf16"]


def test_quantize_rows_scales_each_row_to_the_e4m3_range():
    import torch
    x = torch.tensor([[1.0, -2.0, 0.5], [100.0, 0.0, -300.0]])
    x8, s = fp8_matmul.quantize_rows(x)
    assert s.shape == (2, 1)
    assert torch.equal(x8.float().abs().amax(dim=1), torch.tensor([448.0, 448.0]))
    assert torch.allclose(x8.float() * s, x, rtol=0.07)


@pytest.mark.parametrize("args,says", [(["--reps", "0"], "error: --reps must be at least 1, got 0"),
                                       (["--out", "/nonexistent-dir/x.json"], "error: --out /nonexistent-dir/x.json: No such file"),
                                       (["--out", "/"], "error: --out /: Is a directory")])
def test_fp8_matmul_refuses_bad_arguments_in_one_line(args, says):
    with pytest.raises(SystemExit, match=says):
        fp8_matmul.main(args + ["--device", "cpu"])
