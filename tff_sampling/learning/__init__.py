"""Learning processes (`tff.learning.templates.LearningProcess`) of the project."""

from tff_sampling.learning.fedavg import CLIENT_LOOP
from tff_sampling.learning.fedavg import build_fed_avg
from tff_sampling.learning.fedavg import build_fed_prox
from tff_sampling.learning.multi_model import build_multi_model_process
from tff_sampling.learning.optimal_sampling import build_dsgd_with_aggregator
from tff_sampling.learning.optimal_sampling import build_dsgd_with_optimal_sampling
from tff_sampling.learning.optimal_sampling import build_fed_avg_with_aggregator
from tff_sampling.learning.optimal_sampling import build_fed_avg_with_optimal_sampling
from tff_sampling.learning.signals import build_fed_avg_with_signals
from tff_sampling.learning.signals import build_loss_probe

__all__ = [
  'CLIENT_LOOP',
  'build_dsgd_with_aggregator',
  'build_dsgd_with_optimal_sampling',
  'build_fed_avg_with_aggregator',
  'build_fed_avg_with_optimal_sampling',
  'build_fed_avg',
  'build_fed_avg_with_signals',
  'build_fed_prox',
  'build_loss_probe',
  'build_multi_model_process',
]
