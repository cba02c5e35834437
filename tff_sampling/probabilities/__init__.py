"""Optimal client sampling probabilities (Chen, Horváth, Richtárik, TMLR 2022): for one
model (`single_model`: Algorithm 1, Algorithm 2 from sums only, the sampling variance and
the improvement factor α) and for several models sharing a population (`multi_model`, MMFL),
each in NumPy and as a TensorFlow twin (``*_tf``) that TFF computations run; `common` holds
their argument checks. The formulas, conventions (zero norms, a real-valued budget ``m``)
and the convergence proof of Algorithm 2 are ``docs/algorithms.md`` §1 and §5."""

from tff_sampling.probabilities.common import RescaledProbabilities
from tff_sampling.probabilities.multi_model import approximate_multi_model_probabilities
from tff_sampling.probabilities.multi_model import approximate_multi_model_probabilities_tf
from tff_sampling.probabilities.multi_model import approximate_multi_model_probabilities_with_info
from tff_sampling.probabilities.multi_model import (
  approximate_multi_model_probabilities_with_info_tf,
)
from tff_sampling.probabilities.multi_model import multi_model_improvement_factor
from tff_sampling.probabilities.multi_model import multi_model_improvement_factor_tf
from tff_sampling.probabilities.multi_model import multi_model_probabilities
from tff_sampling.probabilities.multi_model import multi_model_probabilities_tf
from tff_sampling.probabilities.multi_model import multi_model_sampling_variance
from tff_sampling.probabilities.multi_model import multi_model_sampling_variance_tf
from tff_sampling.probabilities.single_model import approximate_optimal_probabilities
from tff_sampling.probabilities.single_model import approximate_optimal_probabilities_tf
from tff_sampling.probabilities.single_model import approximate_optimal_probabilities_with_info
from tff_sampling.probabilities.single_model import approximate_optimal_probabilities_with_info_tf
from tff_sampling.probabilities.single_model import improvement_factor
from tff_sampling.probabilities.single_model import improvement_factor_tf
from tff_sampling.probabilities.single_model import optimal_probabilities
from tff_sampling.probabilities.single_model import optimal_probabilities_tf
from tff_sampling.probabilities.single_model import sampling_variance
from tff_sampling.probabilities.single_model import sampling_variance_tf

__all__ = [
  'optimal_probabilities',
  'approximate_optimal_probabilities_with_info',
  'approximate_optimal_probabilities',
  'sampling_variance',
  'improvement_factor',
  'optimal_probabilities_tf',
  'approximate_optimal_probabilities_with_info_tf',
  'approximate_optimal_probabilities_tf',
  'sampling_variance_tf',
  'improvement_factor_tf',
  'multi_model_probabilities',
  'approximate_multi_model_probabilities_with_info',
  'approximate_multi_model_probabilities',
  'multi_model_sampling_variance',
  'multi_model_improvement_factor',
  'multi_model_probabilities_tf',
  'approximate_multi_model_probabilities_with_info_tf',
  'approximate_multi_model_probabilities_tf',
  'multi_model_sampling_variance_tf',
  'multi_model_improvement_factor_tf',
  'RescaledProbabilities',
]
