"""Server-side samplers with explicit, checkpointable state."""

from tff_sampling.samplers import weighting
from tff_sampling.samplers.base import Population
from tff_sampling.samplers.base import Sampler
from tff_sampling.samplers.base import Selection
from tff_sampling.samplers.base import round_rng
from tff_sampling.samplers.clustered import ClusteredSampler
from tff_sampling.samplers.clustered import ClusteredSamplerState
from tff_sampling.samplers.fedgs import FedGSSampler
from tff_sampling.samplers.lefl import LeflSampler
from tff_sampling.samplers.lefl import LeflState
from tff_sampling.samplers.lefl import cluster_clients
from tff_sampling.samplers.lefl import kl_matrix
from tff_sampling.samplers.md import MDSampler
from tff_sampling.samplers.power_of_choice import PowerOfChoiceSampler
from tff_sampling.samplers.target import TargetSampler
from tff_sampling.samplers.uniform import UniformSampler
from tff_sampling.selection_stats import label_distribution_kl  # Analysis (LEFL's metric).

__all__ = [
  'ClusteredSampler',
  'ClusteredSamplerState',
  'FedGSSampler',
  'LeflSampler',
  'LeflState',
  'MDSampler',
  'Population',
  'PowerOfChoiceSampler',
  'Sampler',
  'Selection',
  'TargetSampler',
  'UniformSampler',
  'cluster_clients',
  'kl_matrix',
  'label_distribution_kl',
  'round_rng',
  'weighting',
]
