"""Logit parity of r1.model.Transformer against transformers for each family."""
import pytest
import torch
import transformers

from r1.model import ModelConfig, Transformer, pack, tiny_config

FAMILIES = [("llama", True), ("llama", False), ("qwen2", True), ("qwen2", False), ("qwen3", True), ("qwen3", False)]


def hf_twin(cfg: ModelConfig, seed=0):
    """A random transformers model of cfg and ours with the same weights."""
    torch.manual_seed(seed)
    hf_cfg = transformers.AutoConfig.for_model(**cfg.to_hf())
    hf = transformers.AutoModelForCausalLM.from_config(hf_cfg, attn_implementation="eager").float().eval()
    with torch.no_grad():  # random norms and biases so they are exercised
        for name, p in hf.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    ours = Transformer(cfg)
    missing, unexpected = ours.load_state_dict(hf.state_dict(), strict=False)
    assert not missing, missing
    assert set(unexpected) <= {"lm_head.weight"}, unexpected
    return hf, ours.eval()


@pytest.mark.parametrize("arch,tie", FAMILIES)
def test_batched_parity(arch, tie):
    hf, ours = hf_twin(tiny_config(arch, tie=tie))
    ids = torch.randint(0, 256, (3, 11))
    with torch.no_grad():
        ref = hf(ids).logits
        got = ours(ids)
    assert got.shape == (3, 11, 256)
    assert (got - ref).abs().max().item() < 1e-4


@pytest.mark.parametrize("arch,tie", FAMILIES)
def test_packed_parity(arch, tie):
    hf, ours = hf_twin(tiny_config(arch, tie=tie))
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (5, 13, 1, 8)]
    ids, pos, cu, mx = pack(seqs)
    with torch.no_grad():
        got = ours(ids, pos, cu, mx)
        for i, s in enumerate(seqs):
            ref = hf(torch.tensor([s])).logits[0]
            assert (got[cu[i]:cu[i + 1]] - ref).abs().max().item() < 1e-4


def test_value_head_shape():
    cfg = tiny_config()
    critic = Transformer(cfg, value_head=True)
    ids = torch.randint(0, 256, (2, 7))
    assert critic(ids).shape == (2, 7)
    ids, pos, cu, mx = pack([[1, 2, 3], [4, 5]])
    assert critic(ids, pos, cu, mx).shape == (5,)


def test_unsupported_arch():
    with pytest.raises(ValueError, match="unsupported architecture 'mamba'; supported: llama, qwen2, qwen3, mistral"):
        ModelConfig.from_hf({"model_type": "mamba"})


def test_activation_checkpointing_keeps_values_and_gradients():
    from r1.distributed import Dist, full_state_dict, parallelize

    torch.manual_seed(0)
    a = Transformer(tiny_config(tie=False))
    b = Transformer(tiny_config(tie=False))
    b.load_state_dict(a.state_dict())
    b = parallelize(b, Dist(0, 1, 0, torch.device("cpu")), activation_checkpointing=True)
    ids, pos, cu, mx = pack([[1, 2, 3, 4], [5, 6, 7]])
    sel, tgt = torch.tensor([0, 1, 2, 4, 5]), torch.tensor([2, 3, 4, 6, 7])
    for m in (a, b):
        logp, ent = m(ids, pos, cu, mx, sel=sel, targets=tgt)
        (logp.sum() + ent.sum()).backward()
    ga = {k: p.grad for k, p in a.named_parameters()}
    gb = {k.replace("_checkpoint_wrapped_module.", ""): p.grad for k, p in b.named_parameters()}
    assert ga.keys() == gb.keys()
    for k in ga:
        assert (ga[k] - gb[k]).abs().max() < 1e-6, k
    assert full_state_dict(b).keys() == a.state_dict().keys()


def test_autocast_training_forward_runs_in_one_dtype_and_stays_close():
    """fp32 master weights under bf16 autocast (the one-GPU trainer): logprobs close to fp32, grads reach fp32."""
    torch.manual_seed(0)
    m = Transformer(tiny_config("qwen3", tie=True))
    ids, pos, cu, mx = pack([[1, 2, 3, 4, 5], [6, 7, 8]])
    sel, tgt = torch.tensor([0, 1, 2, 3, 5, 6]), torch.tensor([2, 3, 4, 5, 7, 8])
    ref, _ = m(ids, pos, cu, mx, sel=sel, targets=tgt)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logp, ent = m(ids, pos, cu, mx, sel=sel, targets=tgt)
    assert ((logp - ref).abs() <= 0.01 * ref.abs() + 0.02).all()  # bf16: ~3 significant digits
    (logp.sum() + ent.sum()).backward()
    assert m.model.embed_tokens.weight.grad.dtype == torch.float32
    assert torch.isfinite(m.model.embed_tokens.weight.grad).all()


def test_compiled_ops_match_eager():
    """compile_ops() (kernels.compile=true) fuses RMSNorm, RoPE and SwiGLU: same logits and gradients as eager."""
    from r1.model import OPS, compile_ops, default_ops, pack, rms_norm, tiny_config

    torch.manual_seed(0)
    model = Transformer(tiny_config("qwen3", tie=False))
    ids, pos, cu, mx = pack([[1, 2, 3, 4, 5], [6, 7, 8]])
    ref = model(ids, pos, cu, mx)
    ref.square().mean().backward()
    ref_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    try:
        compile_ops()
        assert OPS.rms_norm is not rms_norm
        out = model(ids, pos, cu, mx)
        out.square().mean().backward()
        compile_ops(False)
        assert OPS.rms_norm is rms_norm
    finally:
        default_ops()
    assert (out - ref).abs().max() < 1e-5
    for p, g in zip(model.parameters(), ref_grads):
        assert (p.grad - g).abs().max() < 1e-5


def test_compiled_ops_run_while_another_thread_traces():
    """FX tracing is process-wide (a flag and a patched Module.__call__): while one thread compiles, the
    overlapped rollout thread (r1/overlap.py) still calls the compiled ops. They must run (eager, for that
    call) and give the same output, not raise as dynamo does by default (an H200 run died of it, 2026-12-02)."""
    import threading

    from torch.fx.experimental.proxy_tensor import make_fx

    from r1.model import OPS, compile_ops, default_ops, eager_fallbacks, pack, tiny_config

    torch.manual_seed(0)
    model = Transformer(tiny_config("llama"))
    ids, pos, cu, mx = pack([[1, 2, 3, 4, 5], [6, 7, 8]])
    with torch.no_grad():
        ref = model(ids, pos, cu, mx)
    tracing, release, err = threading.Event(), threading.Event(), []

    def held_trace(x):  # a trace that stays open until the main thread is done
        tracing.set()
        release.wait(60)
        return x + 1

    def trace():
        try:
            make_fx(held_trace)(torch.ones(2))
        except BaseException as e:  # noqa: BLE001
            err.append(e)

    calls = {"n": 0}

    def counted(fn):
        def op(*args):
            calls["n"] += 1
            return fn(*args)
        return op

    try:
        compile_ops()
        for name in ("rms_norm", "add_rms_norm", "rope_qk", "rope_write", "swiglu"):
            setattr(OPS, name, counted(getattr(OPS, name)))
        other = threading.Thread(target=trace)
        other.start()
        assert tracing.wait(60)
        before = eager_fallbacks()
        try:
            with torch.no_grad():
                out = model(ids, pos, cu, mx)
            ran_eager = eager_fallbacks() - before
        finally:
            release.set()
            other.join()
    finally:
        default_ops()
    assert not err
    assert (out - ref).abs().max() < 1e-5
    assert ran_eager == calls["n"] > 0  # every compiled-op call of the forward ran eager, and was counted


def test_compiled_op_counts_only_calls_made_while_tracing(monkeypatch):
    """The compiled-op wrapper counts a call as eager only when some thread is FX-tracing."""
    import r1.model

    monkeypatch.setattr(torch, "compile", lambda fn: fn)  # no compiler needed for the wrapper's logic
    op = r1.model._compile(lambda x: x * 2)
    before = r1.model.eager_fallbacks()
    assert op(torch.ones(2)).tolist() == [2.0, 2.0]
    assert r1.model.eager_fallbacks() == before
    monkeypatch.setattr(r1.model, "tracing", lambda: True)
    assert op(torch.ones(2)).tolist() == [2.0, 2.0]
    assert r1.model.eager_fallbacks() == before + 1


def test_default_ops_compile_for_cuda_only(monkeypatch):
    """kernels.compile=auto (the default): the ops are wrappers that compile for CUDA tensors only, so the CPU
    runs eager ops (no compiler, no compile time); false is eager everywhere."""
    import r1.model
    from r1.model import OPS, default_ops, pack, rms_norm, tiny_config, use_ops

    def no_compile(fn):
        raise AssertionError("compiled on the CPU")

    monkeypatch.setattr(r1.model, "_compile", no_compile)
    try:
        default_ops()
        assert OPS.rms_norm is not rms_norm and OPS.compile == "auto" and not OPS.fuse_train
        torch.manual_seed(0)
        model = Transformer(tiny_config("qwen3", tie=False))
        ids, pos, cu, mx = pack([[1, 2, 3, 4, 5], [6, 7, 8]])
        out = model(ids, pos, cu, mx)
        use_ops("false")
        assert OPS.rms_norm is rms_norm
        assert torch.equal(model(ids, pos, cu, mx), out)
    finally:
        monkeypatch.undo()
        default_ops()


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_fused_projections_match_and_stay_in_sync(arch):
    """fuse_projections: same logits, same state_dict keys and tensors, a copy_ into the state_dict (the
    trainer's weight sync) reaches the fused matmuls, fusing twice keeps the first fusion, and replacing
    any one projection's parameter (here only k_proj, or only up_proj) falls back to the separate matmuls."""
    from r1.model import _fused_live, fuse_projections

    torch.manual_seed(0)
    model = Transformer(tiny_config(arch, tie=False)).eval()
    other = Transformer(tiny_config(arch, tie=False)).eval()
    ids, pos, cu, mx = pack([[1, 2, 3, 4, 5], [6, 7, 8]])
    with torch.no_grad():
        ref, ref_other = model(ids, pos, cu, mx), other(ids, pos, cu, mx)
        keys = list(model.state_dict())
        fuse_projections(model)
        attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
        first = attn.fused[0]
        fuse_projections(model)
        assert attn.fused[0] is first  # not re-fused: a live generator's graphs read these tensors
        assert list(model.state_dict()) == keys
        assert _fused_live(attn.fused) and _fused_live(mlp.fused)
        assert (model(ids, pos, cu, mx) - ref).abs().max() < 1e-5
        for k, v in model.state_dict().items():  # the weight sync
            v.copy_(other.state_dict()[k])
        assert (model(ids, pos, cu, mx) - ref_other).abs().max() < 1e-5
        attn.k_proj.weight = torch.nn.Parameter(attn.k_proj.weight * 2)  # detached from the fused tensor
        mlp.up_proj.weight = torch.nn.Parameter(mlp.up_proj.weight * 3)
        assert not _fused_live(attn.fused) and not _fused_live(mlp.fused)
        other.model.layers[0].self_attn.k_proj.weight.mul_(2)
        other.model.layers[0].mlp.up_proj.weight.mul_(3)
        assert (model(ids, pos, cu, mx) - other(ids, pos, cu, mx)).abs().max() < 1e-5
    fused_model = Transformer(tiny_config(arch, tie=False)).requires_grad_(False)
    fuse_projections(fused_model)
    fused_model.model.layers[0].self_attn.v_proj.weight.requires_grad_(True)  # a gradient wanted for one
    out = fused_model(ids, pos, cu, mx)  # the separate path, so it reaches v_proj
    out.sum().backward()
    assert fused_model.model.layers[0].self_attn.v_proj.weight.grad is not None


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_fused_train_projections_match_in_float64(arch, monkeypatch):
    """kernels.fuse_train (OPS.fuse_train): q/k/v and gate/up as one matmul of weights concatenated in the
    forward give the same logits and the same gradient for every parameter, in float64; LoRA-adapted
    projections keep their own path (the adapters are not in the concatenation)."""
    from r1 import model as m

    torch.manual_seed(0)
    model = Transformer(tiny_config(arch, tie=False)).double()
    ids, pos, cu, mx = pack([[1, 2, 3, 4, 5], [6, 7, 8]])
    calls = []
    real = m.concat_linear
    monkeypatch.setattr(m, "concat_linear", lambda x, *ls: calls.append(len(ls)) or real(x, *ls))

    def run(fuse):
        monkeypatch.setattr(m.OPS, "fuse_train", fuse)
        model.zero_grad()
        out = model(ids, pos, cu, mx)
        (out.square().mean()).backward()
        return out.detach(), {k: p.grad.clone() for k, p in model.named_parameters()}

    ref, ref_grads = run(False)
    assert calls == []
    out, grads = run(True)
    assert calls == [3, 2] * model.cfg.num_layers
    assert (out - ref).abs().max() < 1e-12
    for k in ref_grads:
        assert (grads[k] - ref_grads[k]).abs().max() < 1e-12, k


def test_fused_train_projections_leave_lora_apart(monkeypatch):
    from r1 import lora
    from r1 import model as m

    torch.manual_seed(0)
    model = Transformer(tiny_config("llama", tie=False)).double()
    ids, pos, cu, mx = pack([[1, 2, 3, 4, 5]])
    lora.add_adapters(model, 4, 8.0, ["q_proj", "v_proj", "up_proj"])
    for name, p in model.named_parameters():
        if name.endswith("lora_B"):  # zero at init: make the adapters count
            torch.nn.init.normal_(p)
    model.double()
    monkeypatch.setattr(m.OPS, "fuse_train", False)
    ref = model(ids, pos, cu, mx)
    monkeypatch.setattr(m.OPS, "fuse_train", True)
    assert (model(ids, pos, cu, mx) - ref).abs().max() < 1e-12


def test_fuse_train_is_off_unless_the_config_sets_it():
    from r1.config import load_config
    from r1.model import OPS, default_ops
    from r1.run import use_kernels

    default_ops()
    assert not OPS.fuse_train
    try:
        use_kernels(load_config(None, ["kernels.fuse_train=true"]))
        assert OPS.fuse_train
    finally:
        default_ops()
    assert not OPS.fuse_train


@pytest.mark.gpu
def test_fused_train_projections_stay_close_under_autocast_on_cuda(monkeypatch):
    """On CUDA under bf16 autocast (the trainer's one-GPU path), kernels.fuse_train's one matmul rounds
    differently from three: logprobs and every gradient stay within bf16 noise of the separate matmuls."""
    from r1 import model as m

    torch.manual_seed(0)
    dev = torch.device("cuda")
    model = Transformer(tiny_config("llama", tie=False, hidden_size=256, intermediate_size=512, num_heads=8,
                                    num_kv_heads=2, head_dim=32)).to(dev)
    ids, pos, cu, mx = pack([list(range(1, 200)), list(range(5, 90))], device=dev)
    sel = torch.arange(ids.numel() - 1, device=dev)
    tgt = ids[1:]

    def run(fuse):
        monkeypatch.setattr(m.OPS, "fuse_train", fuse)
        model.zero_grad()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logp, _ = model(ids, pos, cu, mx, sel=sel, targets=tgt)
        logp.float().sum().backward()
        return logp.detach().float(), {k: p.grad.clone() for k, p in model.named_parameters()}

    ref, ref_grads = run(False)
    out, grads = run(True)
    assert (out - ref).abs().max() < 5e-2
    for k in ref_grads:
        rel = (grads[k] - ref_grads[k]).norm() / ref_grads[k].norm().clamp_min(1e-12)
        assert rel < 2e-2, (k, float(rel))
