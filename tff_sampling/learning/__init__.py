"""Learning processes (`tff.learning.templates.LearningProcess`) of the project."""

from tff_sampling.learning.fedavg import build_fedavg
from tff_sampling.learning.fedavg import build_fedprox
from tff_sampling.learning.fedavg import CLIENT_LOOP
from tff_sampling.learning.optimal_sampling import build_dsgd_with_optimal_sampling
from tff_sampling.learning.optimal_sampling import build_fed_avg_with_optimal_sampling
