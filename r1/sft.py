"""SFT on the task's expert chats, loss on assistant tokens only: train.stage=sft, or the warm-up of an RL run.

It owns the SFT stage: laying out each expert chat exactly as an RL episode
would be (`expert_example`), so SFT trains on the token structure RL will
sample in, and its training loop. Its run folder has the RL trainer's layout
(config.yaml, metrics.jsonl, tensorboard, checkpoints/, hf/), set up by the
same r1/run.py; `model.path=RUN_DIR/hf` starts RL from it. An RL config with
`train.sft_steps > 0` runs it first in RUN_DIR/sft/ (`warmup_config`) and RL
then starts from RUN_DIR/sft/hf in the same command.
"""
import copy
import math
import os
import time
import warnings

import torch

from r1 import checkpoint, disk, distributed, memory
from r1.config import ConfigError
from r1.identity import run_identity
from r1.logger import Logger, cpu_cost_line
from r1.packing import split_by_tokens
from r1.envs.tools import get_tool
from r1.tasks.data import epoch_order, load_rows
from r1.tasks.registry import check_reset, get_task, task_tools
from r1.run import build_model, check_paths, check_run_dir, create_run_dir, lr_lambda, run_tokenizer

DONE = "done"  # written after hf/: the SFT phase of an RL run is complete


def expert_example(tok, messages, tools) -> tuple:
    """Expert chat -> (ids, mask) with mask 1 on assistant content and its end-of-turn token.

    The opening prompt is rendered with the generation prompt, then per
    assistant turn its content ids and the closing end-of-turn token (mask 1:
    the model must learn to emit them), the forced newline after it and the
    tool turn rendered incrementally (mask 0). Expert chats come from the task
    (GSM8K's `<<48/2=24>>` annotations turned into calculator calls whose
    results our calculator computes; the synthetic task likewise).
    """
    first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    ids = tok.render(messages[:first], tools=tools)
    mask = [0] * len(ids)
    i = first
    while i < len(messages):
        m = messages[i]
        if m["role"] == "assistant":
            prev = tok.render_text(messages[:i], tools=tools, add_generation_prompt=True)
            full = tok.render_text(messages[: i + 1], tools=tools, add_generation_prompt=False)
            if not full.startswith(prev):
                raise ValueError(f"chat template of {tok.name} re-renders earlier turns; cannot lay out SFT turns")
            turn = full[len(prev):]
            body = tok.encode(turn)
            ids += body
            # mask 1 up to and including the first end-of-turn token, 0 on what the template forces after it
            stop = next((k for k, t in enumerate(body) if t in tok.stop_ids), len(body) - 1)
            mask += [1] * (stop + 1) + [0] * (len(body) - stop - 1)
            i += 1
        else:
            j = i
            while j < len(messages) and messages[j]["role"] != "assistant":
                j += 1
            new = tok.render_next(messages[i:j], tools=tools, add_generation_prompt=j < len(messages))
            ids += new
            mask += [0] * len(new)
            i = j
    return ids, mask


def expert_chats(cfg, rows, tools=None) -> list:
    """The task's expert chat for each row (the task registry's `expert`)."""
    task = get_task(cfg.data.task)
    return [task.expert(r, tools) for r in rows]


def tool_schemas(cfg) -> list | None:
    """The OpenAI schemas of the run's tools (the task's own unless env.tools says otherwise), or None."""
    names = task_tools(cfg, get_task(cfg.data.task))
    return [get_tool(n).schema for n in names] or None


def sft_data(cfg):
    """The config whose train rows the SFT phase learns from: data.level replaced by data.sft_level when set."""
    if not cfg.data.sft_level or cfg.data.sft_level == cfg.data.level:
        return cfg
    sft = copy.deepcopy(cfg)
    sft.data.level = cfg.data.sft_level
    return sft


def warmup_config(cfg):
    """The SFT phase of an RL run with train.sft_steps > 0: the same config as an SFT run in run.dir/sft/
    (`tensorboard --logdir RUN_DIR` shows both phases)."""
    sft = copy.deepcopy(cfg)
    sft.run.dir = os.path.join(cfg.run.dir, "sft")
    sft.train.stage, sft.train.steps, sft.train.lr = "sft", cfg.train.sft_steps, cfg.train.sft_lr
    # the schedule of the GSM8K recipe's SFT: short linear warm-up, cosine to 10%
    sft.train.sft_steps, sft.train.warmup, sft.train.schedule = 0, min(20, cfg.train.sft_steps // 10), "cosine"
    sft.train.checkpoint_every = 10 * cfg.train.checkpoint_every  # and at its last step
    sft.model.lora_rank = 0  # SFT trains every weight; a LoRA RL phase then adapts the SFT policy as its base
    sft.run.resume = bool(checkpoint.latest(sft.run.dir))
    return sft


def warmup_done(run_dir: str) -> bool:
    """Whether the SFT phase in run_dir/sft finished and exported its policy."""
    return os.path.isfile(os.path.join(run_dir, "sft", DONE))


def run_sft(cfg):
    train_sft(setup_sft(cfg))


def setup_sft(cfg, then_rl=None) -> dict:
    """Everything that can fail on bad input (paths, model, tokenizer, data), before run.dir is created.
    `then_rl`: the RL config this SFT phase leads into (train.sft_steps); its memory plan is checked
    here too (memory and disk), so an RL phase that cannot fit is refused before the SFT phase spends any time."""
    d = distributed.init(cfg.run.device)
    check_run_dir(cfg)
    check_paths(cfg)  # a missing model or data path names its key before anything loads
    torch.manual_seed(cfg.run.seed)
    tok = run_tokenizer(cfg)
    data = sft_data(cfg)  # data.sft_level's rows, or data.level's
    rows = load_rows(data, "train")  # the data before the plans: a bad data.path is the first word
    if then_rl is not None:  # the RL phase's env, on its first row: a reset() that raises is found before SFT runs
        check_reset(then_rl, tok, rows)
    model = build_model(cfg.model.path, cfg, tok, d.device, seed=cfg.run.seed)
    mcfg = model.cfg
    plan = memory.plan_for(cfg, mcfg, d)  # auto micro_tokens/checkpointing, or refuse in one line
    if then_rl is not None:  # same architecture: the RL phase starts from this model's export
        memory.plan(then_rl, mcfg, d.world, d.device.type, memory.device_capacity(d.device, cfg.run.memory_fraction))
    disk.plan_for(cfg, mcfg, d, then_rl, warmup_config)  # room for both phases' checkpoints and exports, or refuse
    model = distributed.parallelize(model, d, plan.checkpointing)
    tools = tool_schemas(cfg)
    examples = [expert_example(tok, m, tools) for m in expert_chats(cfg, rows, tools)]
    fits = [e for e in examples if len(e[0]) <= cfg.env.max_context]
    if not fits:  # before run.dir exists: nothing is written
        level = f" level-{data.data.level}" if data is not cfg else ""  # data.sft_level's chats
        raise ConfigError(f"config key env.max_context={cfg.env.max_context}: none of the task's {len(examples)}"
                          f"{level} expert chats fits (the shortest is {min((len(e[0]) for e in examples), default=0)} "
                          f"tokens); raise env.max_context")
    examples = fits
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(cfg, cfg.train.steps))
    models, optims, scheds = {"policy": model}, {"policy": opt}, {"policy": sched}
    create_run_dir(cfg, d, run_identity(cfg, rows))
    return dict(cfg=cfg, d=d, tok=tok, model=model, mcfg=mcfg, examples=examples, opt=opt, sched=sched,
                models=models, optims=optims, scheds=scheds, plan=plan)


def train_sft(s: dict):
    cfg, d, tok, model, mcfg, examples = s["cfg"], s["d"], s["tok"], s["model"], s["mcfg"], s["examples"]
    opt, sched, models, optims, scheds = s["opt"], s["sched"], s["models"], s["optims"], s["scheds"]
    start = 0
    if cfg.run.resume and checkpoint.latest(cfg.run.dir):
        start = int(checkpoint.load(checkpoint.latest(cfg.run.dir), models, optims, scheds, d)["iteration"])
    log = Logger(cfg.run.dir, d.main, cfg.log.tensorboard, cfg.log.progress, cfg.train.steps, start,
                 desc="SFT step", postfix=("sft_loss",))
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=d.device.type == "cuda" and d.world == 1)
    B = cfg.train.sft_batch
    try:
        for step in range(start, cfg.train.steps):
            t0 = time.time()
            batch = _batch(examples, step, B, cfg.run.seed)[d.rank::d.world]
            total = float(distributed.all_sum(sum(sum(m) for _, m in batch), d)) / d.world
            opt.zero_grad(set_to_none=True)
            loss_sum, ntok = 0.0, 0
            groups = split_by_tokens(batch, s["plan"].micro_tokens, size=lambda e: len(e[0]))
            # FSDP: every rank runs as many forward/backward passes as the busiest one (fillers train on nothing)
            fill = int(distributed.all_max(len(groups), d)) - len(groups)
            for k, group in enumerate(groups + [[([tok.pad_id] * 2, [0, 0])]] * fill):
                ids, pos, cu, mx, sel, tgt, msk = _collate(group, d.device)
                with autocast:
                    logp, _ = model(ids, pos, cu, mx, sel=sel, targets=tgt)
                # each rank divides by the global count / world: FSDP averages gradients over ranks
                loss = -(logp.float() * msk).sum() / max(total, 1.0)
                loss.backward()
                loss_sum += float(loss.detach())
                ntok += len(ids) if k < len(groups) else 0
            gn = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip or float("inf"))
            gn = gn.full_tensor() if hasattr(gn, "full_tensor") else gn
            bad = not (bool(torch.isfinite(gn)) and math.isfinite(loss_sum))
            if float(distributed.all_sum(float(bad), d)) == 0.0:  # the same decision on every rank
                opt.step()
                sched.step()
            else:
                warnings.warn(f"SFT step {step + 1}: non-finite loss or gradient, update skipped")
            dt = time.time() - t0
            if step == start and (line := cpu_cost_line("step", step + 1, dt, cfg.train.steps - start,
                                                        d.device.type)):
                log.say(line)
            log.log(step + 1, {"sft_loss": float(distributed.all_sum(loss_sum, d)) / d.world, "grad_norm": float(gn),
                               "lr": sched.get_last_lr()[0], "train_tok_s": float(distributed.all_sum(ntok, d)) / dt})
            if cfg.run.save and ((step + 1) % cfg.train.checkpoint_every == 0 or step + 1 == cfg.train.steps):
                checkpoint.save(cfg.run.dir, step + 1, models, optims, scheds, {"iteration": step + 1}, d,
                                keep=cfg.train.keep_checkpoints)
        from r1.weights import save_hf

        full = distributed.full_state_dict(model) if cfg.run.save else None
        if d.main and cfg.run.save:
            save_hf({k: v.detach().cpu().contiguous() for k, v in full.items()}, mcfg.to_hf(torch.float32),
                    os.path.join(cfg.run.dir, "hf"), tokenizer=tok.hf)
            with open(os.path.join(cfg.run.dir, DONE), "w") as f:
                f.write(f"{cfg.train.steps}\n")
        distributed.barrier(d)
    finally:
        log.close()


def _batch(examples, step, B, seed):
    """Step `step`'s B examples from a seeded permutation per epoch."""
    out = []
    for k in range(step * B, (step + 1) * B):
        epoch, j = divmod(k, len(examples))
        out.append(examples[epoch_order(len(examples), f"sft:{seed}:{epoch}")[j]])
    return out


def _collate(group, device):
    ids, pos, cu, sel, tgt, msk = [], [], [0], [], [], []
    for seq, mask in group:
        base = len(ids)
        ids += seq
        pos += range(len(seq))
        cu.append(len(ids))
        sel += range(base, base + len(seq) - 1)
        tgt += seq[1:]
        msk += mask[1:]
    t = lambda x, dt=torch.long: torch.tensor(x, dtype=dt, device=device)  # noqa: E731
    return t(ids), t(pos), t(cu, torch.int32), max(len(s) for s, _ in group), t(sel), t(tgt), t(msk, torch.float32)
