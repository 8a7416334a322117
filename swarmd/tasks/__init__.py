"""Training tasks: the plug-in interface, the registry, and the built-in tasks (swin, albert)."""

from swarmd.tasks.base import StepOutput, Task, TaskContext

__all__ = ["StepOutput", "Task", "TaskContext"]
