"""Packing steps into training micro-batches: variable-length sequences, no padding.

A step's training row is its prompt + response. When a trajectory is append-only (the default context
policy), its steps are one sequence: the last step contains every earlier one as a prefix, so the shared
prefix is computed once and each step's response is a span of it; otherwise every step is its own
sequence. Causal attention makes both give the same logprobs and values (tested). With `share`
(train.share_prefix) the samples of one prompt also share that prompt: a later sample is packed without
it and its attention reads the first sample's prompt rows (`MicroBatch.kv_rows`), float64-equal to the
separate copies (tested); mini-batches are then dealt whole groups at a time. Under FSDP every rank must
run as many micro-batches: a rank with fewer runs `filler()` batches (two pad tokens, nothing trained).
"""
from dataclasses import dataclass
from functools import cached_property
from itertools import chain

import numpy as np
import torch


# Per micro-batch: flat tensors over the packed tokens ([N]) and over the predicted response tokens
# ([M]): `sel` are the positions whose next token is a response token (the logits at position j score
# token j + 1), and for each step the position of its last prompt token (where the critic gives the
# step's value). Shared prompts: positions go on from the prompt's length, the kernels take separate
# query and key lengths (causal from the bottom right), the prompt's rows run through every layer once,
# and the gradient of its keys and values gathers every sample's share, the sum the copies gave. Its last
# row predicts each sample's first response token, so `sel` names it once per sample.
@dataclass
class Sequence:
    ids: list  # token ids of the packed sequence
    spans: list  # (step_key, response_start, response_len) with step_key = (traj_index, step_index)
    traj: int  # trajectory index (a sequence never mixes trajectories)
    head: int = 0  # length of its trajectory's first prompt when the sequence starts with it (shareable), else 0

    @cached_property
    def head_key(self):
        """What the sequence shares with others of its micro-batch: its first prompt's ids, or None (built once:
        split_by_tokens and collate both ask)."""
        return tuple(self.ids[: self.head]) if 0 < self.head < len(self.ids) else None


@dataclass
class MicroBatch:
    input_ids: torch.Tensor  # [N]
    position_ids: torch.Tensor  # [N]
    cu_seqlens: torch.Tensor  # [S+1] int32
    max_seqlen: int
    sel: torch.Tensor  # [M] positions predicting a response token
    targets: torch.Tensor  # [M] the response tokens
    mask: torch.Tensor  # [M] float: 1 = trained on
    tok_step: torch.Tensor  # [M] global step index (0..num_steps-1) of each token
    tok_traj: torch.Tensor  # [M] trajectory index of each token
    step_pos: torch.Tensor  # [K] position of the last prompt token of each step in this micro-batch
    step_index: torch.Tensor  # [K] their global step indices
    num_tokens: int  # N
    kv_rows: tuple | None = None  # (index [N'], cu_k [S+1] int32, max_k) when sequences share a prompt, else None
    shared_tokens: int = 0  # prompt tokens packed once for several sequences: not recomputed


def sequences(trajs, pack_trajectories: bool = True) -> list:
    out = []
    for ti, t in enumerate(trajs):
        if not t.steps:
            continue
        if pack_trajectories and t.is_append_only():
            last = t.steps[-1]
            spans = [((ti, si), len(s.prompt_ids), len(s.response_ids)) for si, s in enumerate(t.steps)]
            out.append(Sequence(last.prompt_ids + last.response_ids, spans, ti, len(t.steps[0].prompt_ids)))
        else:
            for si, s in enumerate(t.steps):
                out.append(Sequence(s.prompt_ids + s.response_ids, [((ti, si), len(s.prompt_ids), len(s.response_ids))],
                                    ti, len(s.prompt_ids) if si == 0 else 0))
    return out


def step_order(trajs) -> dict:
    """(traj_index, step_index) -> global step index, in trajectory order."""
    keys = [(ti, si) for ti, t in enumerate(trajs) for si in range(len(t.steps))]
    return {k: i for i, k in enumerate(keys)}


def split_by_tokens(seqs: list, max_tokens: int, size=lambda s: len(s.ids), share: bool = False) -> list:
    """Greedy split into lists of sequences of at most max_tokens (a longer sequence goes alone). With `share`,
    a sequence whose shareable head is already in the list counts its tokens after the head only."""
    groups, cur, n, heads = [], [], 0, set()
    for s in seqs:
        key = s.head_key if share else None
        cost = len(s.ids) - s.head if key is not None and key in heads else size(s)
        if cur and n + cost > max_tokens:
            groups.append(cur)
            cur, n, heads = [], 0, set()
            cost = size(s)
        cur.append(s)
        n += cost
        if key is not None:
            heads.add(key)
    if cur:
        groups.append(cur)
    return groups


def collate(seqs: list, trajs, order: dict, device, share: bool = False) -> MicroBatch:
    """Pack `seqs` into one micro-batch. Built with numpy from per-span lengths: lists of every token's id,
    position, target and step turned into tensors by torch.tensor made packing 232 ms of host time per iteration
    at configs/gsm8k_tool.yaml's batch, against 59 ms now (bench/host_score.py; docs/decisions.md).
    share: a sequence whose head another sequence here already holds is packed without it (module docstring)."""
    skip, owner = np.zeros(len(seqs), dtype=np.int64), np.arange(len(seqs))
    if share:
        first = {}
        for i, s in enumerate(seqs):
            key = s.head_key
            if key is not None and first.setdefault(key, i) != i:
                skip[i], owner[i] = s.head, first[key]
    full = np.array([len(s.ids) for s in seqs], dtype=np.int64)
    lens = full - skip
    offsets = np.concatenate([[0], np.cumsum(lens)])
    ids = np.fromiter(chain.from_iterable(s.ids[k:] for s, k in zip(seqs, skip.tolist())), dtype=np.int64,
                      count=int(offsets[-1]))
    pos = np.arange(int(offsets[-1]), dtype=np.int64) - np.repeat(offsets[:-1] - skip, lens)
    spans = [(i, key, start, n) for i, s in enumerate(seqs) for key, start, n in s.spans]
    seq_of = np.array([i for i, *_ in spans], dtype=np.int64)
    n = np.array([n for *_, n in spans], dtype=np.int64)
    m = int(n.sum())
    # positions in each sequence, then rows of the micro-batch: a shared head's rows are its owner's
    at = np.array([start - 1 for _, _, start, _ in spans], dtype=np.int64)
    step_pos = _rows(at, seq_of, skip, owner, offsets)
    at_sel = np.arange(m, dtype=np.int64) - np.repeat(np.cumsum(n) - n, n) + np.repeat(at, n)
    seq_sel = np.repeat(seq_of, n)
    sel = _rows(at_sel, seq_sel, skip, owner, offsets)
    # a target (a response token) is never in a shared head: it is the sequence's own row after its position
    targets = ids[offsets[seq_sel] + at_sel + 1 - skip[seq_sel]]
    steps = [trajs[key[0]].steps[key[1]] for _, key, _, _ in spans]
    mask = np.fromiter(chain.from_iterable(st.mask for st in steps), dtype=np.float32)
    if mask.size != m:  # one step's response_mask is not as long as its response: name it
        k = next(k for k, st in enumerate(steps) if len(st.mask) != len(st.response_ids))
        raise ValueError(f"trajectory {trajs[spans[k][1][0]].uid!r} step {spans[k][1][1]}: response_mask has "
                         f"{len(steps[k].mask)} values for {len(steps[k].response_ids)} response tokens")
    if offsets[-1] >= 2**31:
        raise ValueError(f"a micro-batch of {int(offsets[-1]):,} tokens: cu_seqlens are int32 (train.micro_tokens)")
    step_index = np.array([order[key] for _, key, _, _ in spans], dtype=np.int64)
    traj = np.array([key[0] for _, key, _, _ in spans], dtype=np.int64)
    t = lambda x: torch.from_numpy(x).to(device)  # noqa: E731
    kv_rows = None
    if skip.any():  # sequence i's keys: the rows of its every position, its owner's first skip[i], then its own
        cu_k = np.concatenate([[0], np.cumsum(full)])
        index = _rows(np.arange(int(cu_k[-1]), dtype=np.int64) - np.repeat(cu_k[:-1], full),
                      np.repeat(np.arange(len(seqs)), full), skip, owner, offsets)
        kv_rows = (t(index), t(cu_k.astype(np.int32)), int(full.max()))
    return MicroBatch(t(ids), t(pos), t(offsets.astype(np.int32)), int(lens.max()), t(sel), t(targets),
                      t(mask), t(np.repeat(step_index, n)), t(np.repeat(traj, n)), t(step_pos), t(step_index),
                      int(offsets[-1]), kv_rows, int(skip.sum()))


def _rows(at, seq, skip, owner, offsets):
    """Row in the micro-batch of position `at` of sequence `seq` (arrays): a position inside the sequence's
    skipped head is its owner's row, any other follows the sequence's own rows."""
    return np.where(at < skip[seq], offsets[owner[seq]] + at, offsets[seq] + at - skip[seq])


def filler(pad_id: int, device) -> MicroBatch:
    """A micro-batch that trains on nothing: one 2-token sequence, one scored position with mask 0."""
    t = lambda x, dt=torch.long: torch.tensor(x, dtype=dt, device=device)  # noqa: E731
    return MicroBatch(t([pad_id, pad_id]), t([0, 1]), t([0, 2], torch.int32), 2, t([0]), t([pad_id]),
                      t([0.0], torch.float32), t([0]), t([0]), t([0]), t([0]), 2)


@dataclass
class Plan:
    """One rank's iteration laid out for the update: mini-batches of whole trajectories, each a list of
    packed micro-batches (at most `micro_tokens` tokens, a longer sequence alone)."""
    minibatches: list  # [[MicroBatch]]
    num_trajs: int  # B: trajectory ids (tok_traj) are 0..B-1
    num_steps: int  # K: global step ids (tok_step, step_index) are 0..K-1

    @property
    def micro_batches(self) -> list:
        """Every micro-batch, mini-batch by mini-batch: the order of the flat per-token tensors."""
        return [mb for mini in self.minibatches for mb in mini]


def plan(trajs, minibatches: int, micro_tokens: int, device, share: bool = False) -> Plan:
    """Deal trajectories round-robin to `minibatches` mini-batches, then split each into micro-batches.
    share (train.share_prefix): deal whole groups round-robin instead (a group's trajectories in one
    mini-batch, next to each other), and pack each sample's first prompt once per micro-batch."""
    order, seqs = step_order(trajs), sequences(trajs)
    by_traj = {}
    for s in seqs:
        by_traj.setdefault(s.traj, []).append(s)
    traj_ids = sorted(by_traj)
    if share:
        by_group = {}
        for ti in traj_ids:
            by_group.setdefault(trajs[ti].group, []).append(ti)
        groups = list(by_group.values())
        minis = [[ti for g in groups[i::minibatches] for ti in g] for i in range(minibatches)]
    else:
        minis = [traj_ids[i::minibatches] for i in range(minibatches)]
    return Plan([[collate(group, trajs, order, device, share=share)
                  for group in split_by_tokens([s for ti in mini for s in by_traj[ti]], micro_tokens, share=share)]
                 for mini in minis], len(trajs), len(order))
