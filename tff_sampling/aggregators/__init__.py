"""Aggregators: optimal client sampling as a TFF aggregation factory.

`optimal_sampling` holds `OptimalSamplingFactory` (norms, then sums, then each client's
own upload decision); `protocol` the two-phase protocol's parts (who uploads, `Mode`; the
scalar sums, plain or secure, `ScalarSums` / `SecureScalarSums`; the probabilities the
clients compute from the sums); `inner_factories` the sum factories
that may aggregate the uploads (plain, DP); `secure_context` the hint when TFF's context
cannot run secure sums. A TFF user composes the factory into any `tff.learning` builder.
They import only TFF, `tff_sampling.probabilities` (the formulas) and
`tff_sampling.validation`: nothing that trains or runs rounds.
"""

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
