"""Samplers: who trains each round, chosen on the server, with explicit checkpointable state.

`base` holds the interface (`Sampler`: ``initialize``, ``select``, ``observe``; a round's
`Selection` and, under a system model, its `Missed` clients; the `Population`); one module
per sampler (`uniform`, `md`, `clustered` with its `clustered_size` / `clustered_similarity`
/ `clustered_variance` / `sketches` parts, `power_of_choice`, `target`, `fedgs` with
`fedgs_problem` / `fedgs_solvers`, `lefl`, and the system-aware `oort` and `tifl`); and
`weighting`, a sampler's aggregation weights with a plain TFF process. The samplers run on
the server between TFF calls (NumPy, SciPy, SCIP for FedGS); the package imports only
`contract` (the signals they read), `randomness`, `selection_stats` and `validation`: never
TFF processes or the round loop."""

from tff_sampling.samplers import weighting
from tff_sampling.samplers.base import Missed
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
from tff_sampling.samplers.oort import OortConfig
from tff_sampling.samplers.oort import OortSampler
from tff_sampling.samplers.oort import OortState
from tff_sampling.samplers.power_of_choice import PowerOfChoiceSampler
from tff_sampling.samplers.target import TargetSampler
from tff_sampling.samplers.tifl import TiflSampler
from tff_sampling.samplers.tifl import TiflState
from tff_sampling.samplers.uniform import UniformSampler
from tff_sampling.selection_stats import label_distribution_kl  # Analysis (LEFL's metric).

__all__ = [
  'ClusteredSampler',
  'ClusteredSamplerState',
  'FedGSSampler',
  'LeflSampler',
  'LeflState',
  'MDSampler',
  'Missed',
  'OortConfig',
  'OortSampler',
  'OortState',
  'Population',
  'PowerOfChoiceSampler',
  'Sampler',
  'Selection',
  'TargetSampler',
  'TiflSampler',
  'TiflState',
  'UniformSampler',
  'cluster_clients',
  'kl_matrix',
  'label_distribution_kl',
  'round_rng',
  'weighting',
]
