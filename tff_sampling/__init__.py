"""tff-sampling: client sampling for federated learning on TensorFlow Federated."""

from tff_sampling import runtime  # Registers the worker cleanup first.
from tff_sampling import communication
from tff_sampling import learning
from tff_sampling import program
from tff_sampling import samplers
