"""Tasks: a task turns a problem into a prompt and scores a completion. Chosen by name through TASKS."""

from .countdown import TASKS, CountdownTask, Problem

__all__ = ["TASKS", "CountdownTask", "Problem"]
