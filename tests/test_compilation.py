"""Tests for tff_sampling/runtime/compilation.py: TFF's native form built in one pass.

Oracle: TFF 0.87's own pipeline on the same computation (secure sums replaced by their test
bodies with ``replace_secure_intrinsics_with_bodies``, then ``replace_intrinsics_with_bodies``
and ``transform_to_native_form`` without Grappler, a proto between each step). The two cannot
be compared byte for byte: TFF's call-dominant pass names its variables with a random
three-letter prefix and each trace names its TF nodes afresh, so TFF's pipeline differs from
itself run to run. They are compared after mapping those prefixes to one and with each TF
computation as the multiset of its ops.
"""

import collections
import functools
import re

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import graph_pb2
import tensorflow_federated as tff
from tensorflow_federated.python.core.backends.native import compiler as native_compiler
from tensorflow_federated.python.core.backends.test import compiler as test_compiler
from tensorflow_federated.python.core.environments.tensorflow_backend import (
  tensorflow_tree_transformations,
)
from tensorflow_federated.python.core.impl.compiler import building_blocks
from tensorflow_federated.python.core.impl.compiler import transformation_utils
from tensorflow_federated.python.core.impl.computation import computation_impl
from tensorflow_federated.python.core.impl.context_stack import context_stack_impl

from tff_sampling.runtime import compilation

_VALUES = tff.FederatedType(tff.TensorType(np.int32, [3]), tff.CLIENTS)
_FLOATS = tff.FederatedType(tff.TensorType(np.float32, [2]), tff.CLIENTS)


@functools.cache
def _secure_and_plain():
  """Two secure sums of one type (one body traced for both), two of other kinds, and a plain
  mean."""

  @tf.function
  def floor_call(x):  # A function call in the graph, which gets its own session config.
    return tf.floor(x)

  @tff.tensorflow.computation(tff.TensorType(np.float32, [2]))
  def floor(x):
    return tf.cast(floor_call(x), tf.int32)

  @tff.federated_computation(_VALUES, _FLOATS)
  def comp(values, floats):
    a = tff.backends.mapreduce.federated_secure_modular_sum(values, 8)
    b = tff.federated_secure_sum_bitwidth(values, 10)
    c = tff.federated_secure_sum_bitwidth(values, 10)
    d = tff.federated_secure_sum(tff.federated_map(floor, floats), 100)
    return a, b, c, d, tff.federated_mean(floats)

  return comp


def _tff_pipeline(comp):
  comp = test_compiler.replace_secure_intrinsics_with_bodies(comp)
  desugared, _ = tensorflow_tree_transformations.replace_intrinsics_with_bodies(
    comp.to_building_block()
  )
  return native_compiler.transform_to_native_form(
    computation_impl.ConcreteComputation(
      computation_proto=desugared.proto, context_stack=context_stack_impl.context_stack
    ),
    grappler_config=None,
  )


def _shape(comp):
  """The computation's structure (random variable prefixes mapped to one) and, for each of
  its TF computations, the multiset of its ops, the session configs of its calls and
  whether it has its ID."""
  block = comp.to_building_block()
  text = re.sub(r'comp#[0-9a-f]+', 'comp#', block.compact_representation())
  text = re.sub(r'\b_[a-z]{3}(\d+)', r'_v\1', text)
  graphs = []

  def visit(node):
    if isinstance(node, building_blocks.CompiledComputation):
      tf_proto = node.proto.tensorflow
      graph = graph_pb2.GraphDef.FromString(tf_proto.graph_def.value)
      nodes = [*graph.node, *(n for f in graph.library.function for n in f.node_def)]
      ops = collections.Counter(n.op for n in nodes)
      # Grappler switched off in each call, and the ID the worker caches the graph by.
      configs = sorted(n.attr['config_proto'].s for n in nodes if 'config_proto' in n.attr)
      graphs.append((sorted(ops.items()), configs, tf_proto.cache_key.id != 0))
    return node, False

  transformation_utils.transform_postorder(block, visit)
  return text, sorted(graphs)


def _intrinsics(comp):
  found = []

  def visit(node):
    if isinstance(node, building_blocks.Intrinsic):
      found.append(node.uri)
    return node, False

  transformation_utils.transform_postorder(comp.to_building_block(), visit)
  return found


def test_the_same_computation_as_tff_s_pipeline():
  ours = compilation.native_form(_secure_and_plain(), simulate_secure_sums=True)
  assert _shape(ours) == _shape(_tff_pipeline(_secure_and_plain()))
  # What the worker runs: no secure intrinsic and no mean left, federated aggregates in
  # their place.
  uris = set(_intrinsics(ours))
  assert not {u for u in uris if 'secure' in u or 'mean' in u}, uris
  assert 'federated_aggregate' in uris


def test_without_simulated_secure_sums_they_stay():
  ours = compilation.native_form(_secure_and_plain())
  assert {'federated_secure_sum', 'federated_secure_sum_bitwidth'} <= set(_intrinsics(ours))
  assert 'federated_mean' not in _intrinsics(ours)


def test_each_secure_body_is_built_once_per_type(monkeypatch):
  # An empty cache: other tests in this process may have built bodies of other types.
  monkeypatch.setattr(compilation, '_built', {})
  compilation.native_form(_secure_and_plain(), simulate_secure_sums=True)
  built = dict(compilation._built)
  # The two bitwidth sums share one parameter type, so one body.
  kinds = collections.Counter(uri for uri, _ in built)
  assert kinds['federated_secure_sum_bitwidth'] == 1
  again = compilation.native_form(_secure_and_plain(), simulate_secure_sums=True)
  assert dict(compilation._built) == built  # Nothing traced again.
  assert _shape(again) == _shape(_tff_pipeline(_secure_and_plain()))
