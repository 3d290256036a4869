"""Guess my number: a multi-step task of your own in one file.

The env says "higher" or "lower" after each guess; each guess is one MDP
step, stored as the exact tokens the model saw and sampled.
"""
import random
import re

from r1.envs.base import Env, Observation
from r1.tasks.registry import Task, register_task

QUESTION = "I picked a whole number from 1 to 100. Guess it: reply with one number; I will say higher or lower."


class GuessNumber(Env):
    def __init__(self, tokenizer, max_steps: int = 5, **context):
        super().__init__(tokenizer, **context)  # context: max_context, max_new_tokens, policy
        self.max_steps = max_steps

    def reset(self, sample):
        self.target, self.tries = sample["answer"], 0
        return Observation(messages=[{"role": "user", "content": sample["question"]}])

    def step(self, action):
        self.tries += 1
        numbers = re.findall(r"\d{1,3}", action.text[-200:])  # the guess: the last number of the reply
        guess = int(numbers[-1]) if numbers else None
        if guess == self.target:
            return None, 1.0, True, {"final": True, "correct": True}
        if self.tries >= self.max_steps:
            return None, 0.0, True, {"reason": "max_steps"}
        hint = "Reply with a number." if guess is None else "higher" if guess < self.target else "lower"
        return Observation(messages=[{"role": "user", "content": hint}]), 0.0, False, {}


def rows(cfg, split):
    n, seed = (cfg.data.train_size, cfg.run.seed) if split == "train" else (cfg.data.test_size, cfg.run.seed + 1)
    rng = random.Random(f"guess:{seed}")
    return [{"id": f"guess-{split}-{i}", "question": QUESTION, "answer": rng.randint(1, 100)} for i in range(n)]


def make_env(cfg, tokenizer, tools):
    return GuessNumber(tokenizer, max_steps=cfg.env.max_steps, max_context=cfg.env.max_context,
                       max_new_tokens=cfg.rollout.max_new_tokens, policy=cfg.env.context_policy)


TASK = register_task(Task("guess_number", rows, make_env, doc="guess a number from 1 to 100 with hints"))
