"""tff-sampling: client sampling for federated learning on TensorFlow Federated.

Where to look, from the bottom up: `probabilities` (optimal sampling's math),
`aggregators` (optimal client sampling as a TFF aggregation factory), `learning`
(learning processes: FedAvg/FedProx with signals, optimal sampling for FedAvg and DSGD,
multi-model FL), `samplers` (server-side samplers with checkpointable state), `contract`
(what a sampler needs of a process), `runtime` (TFF's context, workers, run directories,
reading runs back), `program` (the round loop: `train_model`, `run_rounds`, and
multi-model runs), `comparisons` (what each binary runs), `analysis` (tables, verdicts
and plots from runs).
"""

from tff_sampling.runtime import tff_context  # noqa: F401  (registers the worker cleanup first)

# isort: split
from tff_sampling import aggregators
from tff_sampling import communication
from tff_sampling import contract
from tff_sampling import learning
from tff_sampling import program
from tff_sampling import randomness
from tff_sampling import runtime
from tff_sampling import samplers

__all__ = [
  'aggregators',
  'communication',
  'contract',
  'learning',
  'program',
  'randomness',
  'runtime',
  'samplers',
]
