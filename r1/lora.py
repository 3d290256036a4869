"""LoRA: low-rank adapters on the projections of one frozen base that policy, critic and reference share.

With model.lora_rank > 0 a run holds the base weights once, frozen (bfloat16 on CUDA, float32 on the
CPU): the policy is the base with adapters on model.lora_targets (y = x W^T + b + scale * dropout(x) A^T
B^T, scale = alpha / rank, B zero so step 0 is the base exactly); the critic shares the very same base
Parameters with its own adapters and value head; the reference is the policy with adapters off, so a KL
term costs no copy. An adapted projection stays an nn.Linear (`LoRALinear`), so names stay Hugging
Face's: a checkpoint holds what requires grad, `merge` folds adapters into weights for the hf/ export,
`peft_state` writes what PEFT reads, over a base its adapter_config.json names by a path transformers
loads (`loadable_base`: model.path, or run.dir/base, written by the export). By default the generator runs
the shared base with rollout-dtype adapter copies (`generator_copy`): a merge into bf16 weights rounds away
small updates (docs/decisions.md, "LoRA"). Dropout applies only to forwards that build a graph (the
update). Under torchrun FSDP2 shards the adapters and value head and leaves the base whole on every rank
(r1/distributed.py `ignored`).
"""
from __future__ import annotations

import contextlib
import json
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

from r1.config_schema import LORA_TARGETS as TARGETS  # a config default: kept where no torch is needed


class LoRALinear(nn.Linear):
    """A frozen nn.Linear (its Parameters, shared as they are) plus trainable A [r, in] and B [out, r]."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, dropout: float, dtype=None, init: bool = True):
        nn.Module.__init__(self)
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight, self.bias = base.weight, base.bias  # the same Parameter objects: nothing copied
        dev = base.weight.device
        self.lora_A = nn.Parameter(torch.zeros(rank, self.in_features, device=dev, dtype=dtype))
        self.lora_B = nn.Parameter(torch.zeros(self.out_features, rank, device=dev, dtype=dtype))
        if init:  # (a generator's copy takes its values from the policy instead: no draw from the RNG)
            nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))  # PEFT's init of lora_A
        self.scale = alpha / rank
        self.dropout = dropout
        self.off = False  # set by adapters_off: the base alone

    def forward(self, x):
        out = F.linear(x, self.weight, self.bias)
        if self.off:
            return out
        h = x
        if self.dropout and self.training and torch.is_grad_enabled():
            h = F.dropout(h, self.dropout, training=True)
        autocast = torch.is_autocast_enabled(x.device.type)
        if not autocast:  # without autocast: adapters keep their own dtype
            h = h.to(self.lora_A.dtype)
        a = F.linear(h, self.lora_A)
        if a.dtype != out.dtype and not autocast:  # adapters of another dtype
            return out + (F.linear(a, self.lora_B) * self.scale).to(out.dtype)
        # out + scale * a B^T as one matmul whose epilogue adds (one rounding, not three; two kernels fewer a
        # projection, which decode at batch 256 runs 7 x layers times a token)
        flat = torch.addmm(out.reshape(-1, out.shape[-1]), a.reshape(-1, a.shape[-1]), self.lora_B.t(), alpha=self.scale)
        return flat.view(out.shape)


def check_targets(targets) -> list:
    """The unknown names in `targets` (config validation names the key)."""
    return [t for t in targets if t not in TARGETS]


def add_adapters(model, rank: int, alpha: float, targets, dropout: float = 0.0, init: bool = True):
    """Replace each targeted projection of every block by a LoRALinear over the same weights; draws A from
    the global RNG, block by block in TARGETS order (init=False: zeros, no draw, for adapters loaded next).
    Returns the model."""
    for layer in model.model.layers:
        for parent in (layer.self_attn, layer.mlp):
            for name in TARGETS:
                if name in targets and hasattr(parent, name):
                    setattr(parent, name, LoRALinear(getattr(parent, name), rank, alpha, dropout, init=init))
    return model


def freeze_base(model):
    """requires_grad False for every parameter that is not an adapter (nor a value head)."""
    for name, p in model.named_parameters():
        if not (name.endswith(("lora_A", "lora_B")) or name.startswith("score.")):
            p.requires_grad_(False)
    return model


def share_body(critic, policy):
    """Point every parameter of the critic's body at the policy's same Parameter object (before adapters:
    both bodies have the same modules and names). The critic's own body storage, if any, is dropped."""
    src = dict(policy.model.named_modules())
    for name, module in critic.model.named_modules():
        for pname in list(module._parameters):
            if module._parameters[pname] is not None:
                module._parameters[pname] = src[name]._parameters[pname]
    return critic


def trainable(model) -> list:
    """The parameters an optimizer steps: every one for full fine-tuning, adapters (+ value head) for LoRA."""
    return [p for p in model.parameters() if p.requires_grad]


@contextlib.contextmanager
def adapters_off(model):
    """Within: `model` computes with its base weights alone."""
    mods = [m for m in model.modules() if isinstance(m, LoRALinear)]
    for m in mods:
        m.off = True
    try:
        yield
    finally:
        for m in mods:
            m.off = False


class Reference:
    """The reference policy of a LoRA run: the policy with its adapters off (the frozen base, no copy)."""

    def __init__(self, policy):
        self.policy = policy

    def __call__(self, *args, **kw):
        with adapters_off(self.policy):
            return self.policy(*args, **kw)


def generator_copy(policy, dtype: torch.dtype):
    """The generator's model under model.lora_generator=adapters: the policy's frozen base (the very same
    Parameter objects where they are in `dtype` already, as on CUDA (bf16) and on the CPU (float32); a cast copy
    where not) and adapters of its own in `dtype`, the policy's values now, `copy_adapters` later. Nothing in it
    needs a gradient. It computes what the update scores, x W^T + scale * (x A^T) B^T, so no merge rounds a
    small update away (bench/lora_precision.py), and it holds no second base: adapters are all it adds."""
    from r1.model import Transformer

    with torch.device("meta"):
        gen = Transformer(policy.cfg)
    src = dict(policy.named_modules())
    for name, module in gen.named_modules():
        for pname, p in list(module._parameters.items()):
            if p is not None:
                s = src[name]._parameters[pname]
                module._parameters[pname] = s if s.dtype == dtype else nn.Parameter(s.detach().to(dtype),
                                                                                   requires_grad=False)
    for name, m in policy.named_modules():
        if isinstance(m, LoRALinear):
            parent, child = name.rsplit(".", 1)
            owner = gen.get_submodule(parent)
            rank = m.lora_A.shape[0]
            copy = LoRALinear(getattr(owner, child), rank, m.scale * rank, 0.0, dtype=dtype, init=False)
            setattr(owner, child, copy)
    gen.requires_grad_(False)  # the shared base is frozen already; this reaches the new adapters
    copy_adapters(gen, policy.state_dict())
    return gen.eval()


def copy_adapters(model, state: dict):
    """Copy every `X.lora_A` / `X.lora_B` of a state dict into the model's own, in place (CUDA graphs read
    them where they are), cast to the model's dtype; the base is left alone."""
    own = dict(model.named_parameters())
    with torch.no_grad():
        for k, v in state.items():
            if k.endswith((".lora_A", ".lora_B")):
                own[k].copy_(v)


def merged_items(state: dict, scale: float):
    """(key, tensor) of the plain state dict, one at a time: W + scale * B @ A (in float32, back in W's dtype)
    for every projection with `X.lora_A`/`X.lora_B`, the adapter keys dropped. One at a time so that the
    generator's refresh holds one merged matrix beside the models, not a second model."""
    for k, v in state.items():
        if k.endswith((".lora_A", ".lora_B")):
            continue
        prefix = k[:-len(".weight")]
        if k.endswith(".weight") and prefix + ".lora_A" in state:
            delta = state[prefix + ".lora_B"].float() @ state[prefix + ".lora_A"].float()
            v = (v.float() + scale * delta).to(v.dtype)
        yield k, v


def merge(state: dict, scale: float) -> dict:
    """The plain state dict of a state dict with adapters (merged_items, all at once). Pure."""
    return dict(merged_items(state, scale))


def peft_state(state: dict) -> dict:
    """The adapters of a full state dict under PEFT's names (base_model.model.X.lora_A.weight)."""
    return {f"base_model.model.{k}.weight": v for k, v in state.items() if k.endswith((".lora_A", ".lora_B"))}


def loadable_base(model_path: str) -> str | None:
    """model.path as the absolute path a PEFT adapter names as its base, when it is an HF folder that
    transformers loads (config.json in it); None for a .gguf file, a short name or the random tiny model,
    whose base the export writes as run.dir/base (HF) instead."""
    path = os.path.abspath(os.path.expanduser(model_path))
    return path if os.path.isfile(os.path.join(path, "config.json")) else None


def base_state(state: dict) -> dict:
    """The frozen base of a state dict with adapters: every key but the adapters'. Pure."""
    return {k: v for k, v in state.items() if not k.endswith((".lora_A", ".lora_B"))}


def save_peft(state: dict, folder: str, rank: int, alpha: float, dropout: float, targets, base: str):
    """Write a PEFT adapter folder (adapter_config.json + adapter_model.safetensors) from a full state dict,
    written into a temporary sibling and renamed into place like r1/weights.py save_hf."""
    import shutil

    from safetensors.torch import save_file

    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": alpha,
              "lora_dropout": dropout, "target_modules": sorted(targets), "bias": "none", "fan_in_fan_out": False,
              "base_model_name_or_path": base, "inference_mode": True, "init_lora_weights": True,
              "use_rslora": False, "use_dora": False, "modules_to_save": None}
    tmp = folder.rstrip("/") + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    tensors = {k: v.detach().float().cpu().contiguous() for k, v in peft_state(state).items()}
    save_file(tensors, os.path.join(tmp, "adapter_model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(tmp, "adapter_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=1)
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)


def check_peft_folder(folder: str):
    """A ValueError naming what is missing when `folder` is not a PEFT adapter folder (adapter_config.json and
    adapter_model.safetensors): eval.py calls it before loading any model, so a wrong path costs no load."""
    if not os.path.isdir(folder):
        raise ValueError(f"LoRA adapter folder {folder}: no such folder")
    missing = [n for n in ("adapter_config.json", "adapter_model.safetensors")
               if not os.path.isfile(os.path.join(folder, n))]
    if missing:
        raise ValueError(f"LoRA adapter folder {folder} is not a PEFT adapter: it has no {' and no '.join(missing)}")


def load_peft(model, folder: str):
    """Put the adapters of a PEFT folder (save_peft's, r1's RUN/adapter) on `model`, unmerged: the arithmetic of
    the run's generator under model.lora_generator=adapters, which a merge into bf16 weights would round
    (eval.py evaluates a LoRA run this way). Its rank, alpha and targets come from adapter_config.json; a folder
    that does not fit the model is a ValueError naming the folder and the first key at fault. Returns the model."""
    from safetensors.torch import load_file

    check_peft_folder(folder)
    try:
        with open(os.path.join(folder, "adapter_config.json"), encoding="utf-8") as f:
            conf = json.load(f)
        tensors = load_file(os.path.join(folder, "adapter_model.safetensors"))
    except (OSError, ValueError) as e:
        why = f"{e.strerror}: {e.filename}" if isinstance(e, OSError) and e.strerror and e.filename else e
        raise ValueError(f"LoRA adapter folder {folder}: {why}") from None
    targets = conf.get("target_modules") or []
    if any(conf.get(k) for k in ("use_rslora", "use_dora", "alpha_pattern", "rank_pattern")):
        raise ValueError(f"LoRA adapter folder {folder}: adapter_config.json asks for rsLoRA, DoRA or per-module "
                         f"ranks / alphas, which r1's adapters do not compute")
    if conf.get("peft_type") != "LORA" or not conf.get("r") or "lora_alpha" not in conf or check_targets(targets):
        raise ValueError(f"LoRA adapter folder {folder}: adapter_config.json is not a LoRA adapter of r1's "
                         f"projections (peft_type {conf.get('peft_type')!r}, r {conf.get('r')!r}, lora_alpha "
                         f"{conf.get('lora_alpha')!r}, target_modules {targets!r})")
    add_adapters(model, int(conf["r"]), float(conf["lora_alpha"]), targets, init=False)
    want = peft_state(model.state_dict())
    missing, extra = sorted(set(want) - set(tensors)), sorted(set(tensors) - set(want))
    if missing or extra:
        key = (missing or extra)[0]
        raise ValueError(f"LoRA adapter folder {folder} does not fit the model: "
                         f"{'no tensor' if missing else 'an unknown tensor'} {key}")
    own = dict(model.named_parameters())
    with torch.no_grad():
        for k, v in tensors.items():
            name = k[len("base_model.model."):-len(".weight")]
            if own[name].shape != v.shape:
                raise ValueError(f"LoRA adapter folder {folder} does not fit the model: {k} is {list(v.shape)}, "
                                 f"the model's {list(own[name].shape)}")
            own[name].copy_(v)
    return model
