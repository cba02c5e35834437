"""TFF aggregation factories of the project."""

from tff_sampling.aggregators.optimal_sampling import MODES
from tff_sampling.aggregators.optimal_sampling import OptimalSamplingFactory
from tff_sampling.aggregators.optimal_sampling import uplink_from_measurements
