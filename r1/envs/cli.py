"""Kept for one contract: the maintainers' design names `r1.envs.cli.Sandbox(root)` and checks outside
this repository import it from here. The sandbox lives in r1/envs/sandbox.py, its commands in
r1/envs/shell_commands.py; new code imports those (the name `cli` belongs to the task, r1/tasks/cli.py).
"""
from r1.envs.sandbox import MAX_OUTPUT, SHELL, Sandbox, ShellResult, shell_tool  # noqa: F401
