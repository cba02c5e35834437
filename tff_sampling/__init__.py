"""tff-sampling: client sampling for federated learning on TensorFlow Federated.

Where to look: `aggregators` (optimal client sampling as a TFF aggregation
factory), `learning` (learning processes: FedAvg/FedProx with signals, optimal
sampling for FedAvg and DSGD, multi-model FL), `samplers` (server-side samplers
with checkpointable state), `contract` (what a sampler needs of a process:
client input, signals, probes), `program` (the round loop: `run_experiment`,
`run_rounds`), `multi_model_program` (MMFL runs in that loop), `randomness`
(every draw from (seed, round, stream)), `results` and `report` (reading runs,
summary tables and plots).
"""

from tff_sampling import runtime  # Registers the worker cleanup first.

# isort: split
from tff_sampling import aggregators
from tff_sampling import communication
from tff_sampling import contract
from tff_sampling import learning
from tff_sampling import program
from tff_sampling import randomness
from tff_sampling import results
from tff_sampling import samplers

__all__ = [
  'aggregators',
  'communication',
  'contract',
  'learning',
  'program',
  'randomness',
  'results',
  'runtime',
  'samplers',
]
