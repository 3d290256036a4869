"""Environments of the step-level MDP: the Env API, the tool env and its tools.

Each module here owns one piece (README, Layout): base.py the Env API,
context.py the context policies, rewards.py the reward terms, tool_env.py
the tool-calling env, tools.py the tool table and the calculator,
sandbox.py + shell_commands.py the command-line sandbox (cli.py re-exports
it). This file only marks the package and imports nothing, so
`import r1.envs.tools` stays cheap.
"""
