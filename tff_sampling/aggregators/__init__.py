"""TFF aggregation factories of the project."""

from tff_sampling.aggregators.inner_factories import check_sum_factory
from tff_sampling.aggregators.inner_factories import dp_gaussian_sum_factory
from tff_sampling.aggregators.inner_factories import register_sum_factory
from tff_sampling.aggregators.optimal_sampling import MODES
from tff_sampling.aggregators.optimal_sampling import Mode
from tff_sampling.aggregators.optimal_sampling import OptimalSamplingFactory
from tff_sampling.aggregators.protocol import ScalarSums
from tff_sampling.aggregators.protocol import SecureScalarSums
from tff_sampling.aggregators.secure_context import SecureSumContextError
from tff_sampling.aggregators.secure_context import with_secure_sum_hint

__all__ = [
  'MODES',
  'Mode',
  'OptimalSamplingFactory',
  'ScalarSums',
  'SecureScalarSums',
  'SecureSumContextError',
  'check_sum_factory',
  'dp_gaussian_sum_factory',
  'register_sum_factory',
  'with_secure_sum_hint',
]
