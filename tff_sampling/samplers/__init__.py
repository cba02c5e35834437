"""Server-side samplers with explicit, checkpointable state."""

from tff_sampling.samplers.base import Population
from tff_sampling.samplers.base import round_rng
from tff_sampling.samplers.base import Sampler
from tff_sampling.samplers.base import Selection
from tff_sampling.samplers.uniform import UniformSampler
