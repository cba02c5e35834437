"""Learning processes (`tff.learning.templates.LearningProcess`) of the project."""

from tff_sampling.learning.fedavg import build_fedavg
from tff_sampling.learning.fedavg import CLIENT_LOOP
