"""The task interface, defined in the library (`tff_sampling.task`) so that the
program loop can depend on it without importing this package."""

from tff_sampling.task import Task

__all__ = ['Task']
