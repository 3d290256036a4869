"""Tasks: what a run trains on (rows, the env of an episode, its reward, an expert for SFT).

task.py holds the `Task` record and the table, registry.py looks tasks up
(by name or `package.module:attr`), builtin.py registers synthetic, gsm8k,
gsm8k_tool and cli; gsm8k.py, synthetic.py and cli.py are the tasks
themselves. This file imports nothing.
"""
