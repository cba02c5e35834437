"""A clear error when a computation with secure sums runs outside TFF's test context.

TFF 0.87's default execution context cannot run ``tff.federated_secure_sum*``:
its C++ runtime fails with a bare "Cannot embed a federated value" (a gRPC
``INVALID_ARGUMENT`` naming internal locals). The test execution context,
which `tff_sampling.runtime.tff_context.use_secure_sum_simulation` installs, compiles each
secure sum into a plain sum with the same bound checks (the simulation of
secure aggregation).

`with_secure_sum_hint` returns a process whose ``next`` is the same
computation (same proto and type, so it composes, splits over workers and
traces exactly like the original) but which, when TFF fails with that error,
raises `SecureSumContextError` saying what to call. `OptimalSamplingFactory`
(with ``secure=True``) and the builders of `tff_sampling.learning.
optimal_sampling` return such processes; for a process you compose yourself
(e.g. ``tff.learning.algorithms.build_weighted_fed_avg(model_aggregator=
OptimalSamplingFactory(m))``), wrap it, or call
``tff_sampling.runtime.tff_context.use_secure_sum_simulation()`` before running it.

The context is not switched automatically: installing a default context is a
process-wide choice (it replaces, for example, a remote context the user set
up, and stops the local worker TFF had started), which a library call that
only *builds* a computation should not make behind the user's back. The
program loop (`tff_sampling.program.train_model`) makes it explicitly.
"""

from __future__ import annotations

from typing import Any, Protocol, TypeVar

import tensorflow_federated as tff
from tensorflow_federated.python.core.impl.compiler import building_blocks
from tensorflow_federated.python.core.impl.compiler import tree_analysis
from tensorflow_federated.python.core.impl.computation import computation_impl
from tensorflow_federated.python.core.impl.context_stack import context_stack_impl

# TFF's runtime error for an intrinsic its default context cannot execute.
TFF_MESSAGE = 'Cannot embed a federated value'

HINT = (
  'This computation contains secure sums (tff.federated_secure_sum_bitwidth, e.g. from '
  'OptimalSamplingFactory(secure=True) or tff.aggregators.SecureSumFactory), which TFF '
  "0.87's default execution context cannot run (TFF's error: \"Cannot embed a federated "
  'value"). Call tff_sampling.runtime.tff_context.use_secure_sum_simulation() once before '
  "running it: it installs TFF's test execution context, which simulates secure sums. Or build the "
  'aggregator with secure=False.'
)

_SECURE_URIS = frozenset(
  {
    'federated_secure_sum',
    'federated_secure_sum_bitwidth',
    'federated_secure_modular_sum',
    'federated_secure_select',
  }
)


class SecureSumContextError(RuntimeError):
  """A computation with secure sums ran in a context that cannot run them."""


class _HintingComputation(computation_impl.ConcreteComputation):
  """A `ConcreteComputation` that turns TFF's secure-sum failure into `SecureSumContextError`."""

  def __call__(self, *args, **kwargs):
    try:
      return super().__call__(*args, **kwargs)
    except Exception as e:  # pylint: disable=broad-except
      if TFF_MESSAGE in str(e):
        raise SecureSumContextError(HINT) from e
      raise


def has_secure_sums(computation: tff.Computation) -> bool:
  """Whether `computation` calls a secure aggregation intrinsic."""
  found = []

  def record(node):
    if isinstance(node, building_blocks.Intrinsic) and node.uri in _SECURE_URIS:
      found.append(node.uri)
    return False

  tree_analysis.count(computation.to_building_block(), record)
  return bool(found)


def hinting_computation(computation: tff.Computation) -> tff.Computation:
  """`computation` with `SecureSumContextError` for TFF's secure-sum failure.

  Returns `computation` itself unless it is a concrete computation (already
  hinting ones are returned as they are).
  """
  if isinstance(computation, _HintingComputation) or not isinstance(
    computation, computation_impl.ConcreteComputation
  ):
    return computation
  return _HintingComputation(
    computation_proto=computation_impl.ConcreteComputation.get_proto(computation),
    context_stack=context_stack_impl.context_stack,
    annotated_type=computation.type_signature,
  )


class _HasNext(Protocol):
  """A process with a ``next`` computation (what `with_secure_sum_hint` reads)."""

  @property
  def next(self) -> Any: ...


_Process = TypeVar('_Process', bound=_HasNext)


def with_secure_sum_hint(process: _Process, *, check: bool = True) -> _Process:
  """The same process, raising `SecureSumContextError` instead of TFF's bare error.

  Args:
    process: A `tff.learning.templates.LearningProcess` or
      `tff.templates.AggregationProcess`.
    check: Wrap only if ``process.next`` contains a secure sum (the check walks
      the computation once); ``False`` wraps unconditionally.

  Returns:
    A process of the same kind whose ``next`` hints; the process itself if it
    has no secure sum.

  Raises:
    TypeError: For another kind of process.
  """
  if check and not has_secure_sums(process.next):
    return process
  next_fn = hinting_computation(process.next)
  if isinstance(process, tff.learning.templates.LearningProcess):
    return tff.learning.templates.LearningProcess(
      process.initialize,
      next_fn,
      process.get_model_weights,
      process.set_model_weights,
      get_hparams_fn=process.get_hparams,
      set_hparams_fn=process.set_hparams,
    )
  if isinstance(process, tff.templates.AggregationProcess):
    return tff.templates.AggregationProcess(process.initialize, next_fn)
  raise TypeError(
    'with_secure_sum_hint takes a tff.learning.templates.LearningProcess or a '
    f'tff.templates.AggregationProcess, got {type(process).__name__}.'
  )
