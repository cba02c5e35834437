"""The project's one source of randomness: NumPy generators keyed by (seed, round, stream…).

Every random choice (cohorts, candidates, availability masks, the clients'
data order, k-means starts) comes from `round_rng`, never from a global seed, so
a run restarted from a checkpoint at round ``r`` makes the same choices for
rounds ``r + 1, …``. *Streams* separate independent uses within one round (the
cohort draw, each client's shuffle, …) so that adding a use never shifts
another. The streams shared by several modules are named here; a sampler's
private streams are constants of its own module.
"""

from __future__ import annotations

import numpy as np

# A client's data order in a round (single-model loop, and the probes that replay round 0).
CLIENT_SHUFFLE_STREAM = 1
# A client's data order for one model of a multi-model round (stream ..., client, model).
MODEL_SHUFFLE_STREAM = 7


def round_rng(seed: int, round_num: int, *stream: int) -> np.random.Generator:
  """The generator for (seed, round[, stream…])."""
  return np.random.default_rng([int(seed), int(round_num), *map(int, stream)])


def client_shuffle_seed(seed: int, round_num: int, client: int) -> int:
  """The seed of client `client`'s data order in round `round_num`."""
  rng = round_rng(seed, round_num, CLIENT_SHUFFLE_STREAM, client)
  return int(rng.integers(2**31 - 1))
