"""Tasks: datasets, prompts and rewards (GSM8K and the synthetic default task).

A task is a module with plain functions over rows of the form
`{"id", "question", "answer", "solution"}`; this file imports nothing.
"""
