"""Environments of the step-level MDP: the Env API, the tool env and its tools.

Each module here owns one piece (see docs/DESIGN.md); this file only marks the
package and imports nothing, so `import r1.envs.tools` stays cheap.
"""
