"""Which inner factories `OptimalSamplingFactory` accepts for the weighted uploads: sums only
(the factory divides by ``Σ w_i`` itself), recognised from the factory's configuration without
running it, through TFF's sum-preserving wrappers, and classes registered with
`register_sum_factory`; a mean is refused with a TypeError naming the sum to pass instead.
The accepted list is ``docs/optimal_sampling.md``; `dp_gaussian_sum_factory` builds the
fixed-clip Gaussian DP sum."""

from __future__ import annotations

import tensorflow_federated as tff

# Not exported as tff.aggregators.* in TFF 0.87, but the building blocks of its
# distributed-DP and secure-aggregation pipelines (tff.learning.ddp_secure_aggregator).
from tensorflow_federated.python.aggregators import discretization
from tensorflow_federated.python.aggregators import distributed_dp
from tensorflow_federated.python.aggregators import modular_clipping
import tensorflow_privacy as tfp

from tff_sampling import validation

# TFF 0.87's leaf factories that return the sum of their client values.
_SUM_FACTORIES = (
  tff.aggregators.SumFactory,
  tff.aggregators.SecureSumFactory,
  tff.aggregators.EncodedSumFactory,
)

# DP queries whose noised result is the sum of this round's clipped records
# plus noise (no normalisation, no accumulation over rounds).
_SUM_QUERIES = (
  tfp.GaussianSumQuery,
  tfp.QuantileAdaptiveClipSumQuery,
  tfp.DistributedSkellamSumQuery,
  tfp.DistributedDiscreteGaussianSumQuery,
)

# TFF 0.87 builds these wrappers as classes local to a function, a new class per
# call, so they are recognised by module and qualified name; the wrapped factory
# is the closure variable ``inner_agg_factory`` of their ``create``.
_WRAPPERS = {
  (
    'tensorflow_federated.python.aggregators.robust',
    '_make_wrapper.<locals>.UnweightedRobustFactory',
  ): 'clipping_factory/zeroing_factory',
  (
    'tensorflow_federated.python.aggregators.concat',
    '_unweighted_concat_factory.<locals>.UnweightedConcatFactory',
  ): 'concat_factory',
  # Weighted wrappers: never accepted, but what they wrap says what to pass instead (the
  # weighted forms of tff.learning's aggregators wrap a weighted mean).
  (
    'tensorflow_federated.python.aggregators.robust',
    '_make_wrapper.<locals>.WeightedRobustFactory',
  ): 'clipping_factory/zeroing_factory',
  (
    'tensorflow_federated.python.aggregators.concat',
    '_weighted_concat_factory.<locals>.WeightedConcatFactory',
  ): 'concat_factory',
}

# TFF 0.87's wrappers that return the sum of what their inner factory sums (kept
# in ``_inner_agg_factory``).
_SUM_PRESERVING_WRAPPERS = (
  tff.aggregators.HadamardTransformFactory,
  tff.aggregators.DiscreteFourierTransformFactory,
  discretization.DiscretizationFactory,
  modular_clipping.ModularClippingSumFactory,
)

_REGISTERED: set[type] = set()

ACCEPTED = (
  'tff.aggregators.SumFactory, SecureSumFactory, EncodedSumFactory or '
  'DistributedDpSumFactory; DifferentiallyPrivateFactory with a sum query '
  '(tfp.GaussianSumQuery, QuantileAdaptiveClipSumQuery, DistributedSkellamSumQuery or '
  'DistributedDiscreteGaussianSumQuery, e.g. '
  'tff_sampling.aggregators.dp_gaussian_sum_factory(noise_multiplier, clip)); '
  'HadamardTransformFactory, DiscreteFourierTransformFactory, DiscretizationFactory, '
  'ModularClippingSumFactory (with SecureModularSumFactory inside), clipping_factory, '
  'zeroing_factory or concat_factory around one of these; or a class registered with '
  'tff_sampling.aggregators.register_sum_factory'
)
# What to pass instead of the means that tff.learning's aggregator builders return.
_MEAN_ADVICE = (
  '; tff.learning.ddp_secure_aggregator, compression_aggregator, secure_aggregator and '
  'dp_aggregator return such means: pass the sum they wrap instead, e.g. '
  'distributed_dp.DistributedDpSumFactory(noise_multiplier, expected_clients_per_round, '
  'bits, l2_clip) (from tensorflow_federated.python.aggregators) or '
  'tff.aggregators.EncodedSumFactory.quantize_above_threshold(bits, threshold)'
)


def register_sum_factory(factory_class: type) -> type:
  """Declares that instances of `factory_class` return the sum of their client values.

  Usable as a class decorator. The class must be an
  `tff.aggregators.UnweightedAggregationFactory`.

  Raises:
    TypeError: If `factory_class` is not such a class.
  """
  if not (
    isinstance(factory_class, type)
    and issubclass(factory_class, tff.aggregators.UnweightedAggregationFactory)
  ):
    raise TypeError(
      'register_sum_factory takes a subclass of tff.aggregators.'
      f'UnweightedAggregationFactory, got {factory_class!r}.'
    )
  _REGISTERED.add(factory_class)
  return factory_class


def dp_gaussian_sum_factory(
  noise_multiplier: float, clip: float
) -> tff.aggregators.DifferentiallyPrivateFactory:
  """The DP inner factory: clip each value to L2 norm `clip`, sum, add Gaussian noise.

  The noise has standard deviation ``noise_multiplier · clip`` on the sum,
  as in `tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed`, but the
  result is not divided by ``clients_per_round``: `OptimalSamplingFactory`
  divides by the weight sum.
  """
  if not noise_multiplier >= 0:
    raise ValueError(f'noise_multiplier must be non-negative, got {noise_multiplier!r}.')
  validation.positive_number('clip', clip)
  return tff.aggregators.DifferentiallyPrivateFactory(
    tfp.GaussianSumQuery(l2_norm_clip=float(clip), stddev=float(clip) * float(noise_multiplier))
  )


def _wrapped_factory(factory):
  """The inner factory of a TFF wrapper (see `_WRAPPERS`), or None if not one."""
  cls = type(factory)
  if (cls.__module__, cls.__qualname__) not in _WRAPPERS:
    return None
  create = cls.create
  names = create.__code__.co_freevars
  if 'inner_agg_factory' not in names or create.__closure__ is None:
    return None
  return create.__closure__[names.index('inner_agg_factory')].cell_contents


def _describe(factory) -> str:
  cls = type(factory)
  wrapper = _WRAPPERS.get((cls.__module__, cls.__qualname__))
  if wrapper:
    return f'tff.aggregators.{wrapper}'
  if getattr(tff.aggregators, cls.__name__, None) is cls:
    return f'tff.aggregators.{cls.__name__}'
  return f'{cls.__module__}.{cls.__qualname__}'


def _refusal(factory, reason: str, *, modular: bool = False) -> str:
  """The reason a factory is refused, or '' if it sums.

  `modular`: inside a `ModularClippingSumFactory`, whose range makes a modular
  sum the sum.
  """
  if isinstance(factory, tff.aggregators.WeightedAggregationFactory):
    inner = _wrapped_factory(factory)
    if inner is not None:
      return _refusal(inner, f' (inside {_describe(factory)}{reason})')
    if isinstance(factory, tff.aggregators.MeanFactory):
      return f'{_describe(factory)} is a weighted mean{reason}{_MEAN_ADVICE}'
    return f'{_describe(factory)} is a weighted aggregation{reason}'
  if not isinstance(factory, tff.aggregators.UnweightedAggregationFactory):
    return f'{factory!r} is not a tff.aggregators.UnweightedAggregationFactory{reason}'
  if isinstance(factory, (*_REGISTERED, *_SUM_FACTORIES, distributed_dp.DistributedDpSumFactory)):
    return ''
  if modular and isinstance(factory, tff.aggregators.SecureModularSumFactory):
    return ''
  if isinstance(factory, _SUM_PRESERVING_WRAPPERS):
    inner = factory._inner_agg_factory  # pylint: disable=protected-access
    return _refusal(
      inner,
      f' (inside {_describe(factory)}{reason})',
      modular=isinstance(factory, modular_clipping.ModularClippingSumFactory),
    )
  if isinstance(factory, tff.aggregators.UnweightedMeanFactory):
    return (
      f'tff.aggregators.UnweightedMeanFactory returns a mean (the sum divided by the '
      f'number of clients){reason}{_MEAN_ADVICE}'
    )
  if isinstance(factory, tff.aggregators.DifferentiallyPrivateFactory):
    query = factory._query  # pylint: disable=protected-access
    if isinstance(query, tfp.NormalizedQuery):
      return (
        'tff.aggregators.DifferentiallyPrivateFactory with a tfp.NormalizedQuery (what '
        'gaussian_fixed, gaussian_adaptive, tree_aggregation and tree_adaptive build) '
        f'returns the noised sum divided by clients_per_round{reason}; for DP noise on '
        'the sum use tff_sampling.aggregators.dp_gaussian_sum_factory(noise_multiplier, '
        'clip)'
      )
    if not isinstance(query, _SUM_QUERIES):
      return (
        f'tff.aggregators.DifferentiallyPrivateFactory with a {type(query).__name__} '
        f"is not known to return this round's sum{reason}"
      )
    record_factory = factory._record_aggregation_factory  # pylint: disable=protected-access
    return _refusal(
      record_factory, f' (the record aggregation factory of a DifferentiallyPrivateFactory{reason})'
    )
  inner = _wrapped_factory(factory)
  if inner is not None:
    return _refusal(inner, f' (inside {_describe(factory)}{reason})')
  return f'{_describe(factory)} is not known to return the sum of its client values{reason}'


def check_sum_factory(factory) -> None:
  """Raises TypeError unless `factory` returns the sum of its client values (module rules).

  Raises:
    TypeError: Naming the offending (possibly nested) factory and what is
      accepted.
  """
  reason = _refusal(factory, '')
  if reason:
    raise TypeError(
      f'inner_factory must return the SUM of its client values (OptimalSamplingFactory '
      f'divides that sum by the weight sum itself), but {reason}. Accepted: {ACCEPTED}.'
    )
