r"""Client availability (FedGS, Wang et al., AAAI 2023): in round ``t`` client ``i`` is active
independently with probability ``p_i(t)`` of one of the seven modes (IDL, MDF, LDF, YMF, YC,
LN, SLN; HOMO besides), and samplers select among the active clients only. Masks depend on
(mode, β, population, seed, round) alone. The table of modes and every choice made here are
``docs/algorithms.md`` §3c."""

from collections.abc import Iterable, Sequence
import dataclasses
import math
import numbers

import numpy as np

AVAILABILITY_MODES = ('IDL', 'MDF', 'LDF', 'YMF', 'YC', 'LN', 'SLN', 'HOMO')
DEFAULT_PERIOD = 24
DEFAULT_MAX_REDRAWS = 1000

# Modes whose probabilities change with the round.
_TIME_VARYING_MODES = ('YC', 'SLN')
# Modes whose log-normal sigma ln(1/(1−β)) must be finite.
_LOGNORMAL_MODES = ('LN', 'SLN')
# Modes that read the clients' labels.
_LABEL_MODES = ('YMF', 'YC')

# Stream word of the mask draws: `[seed, round, _MASK_STREAM + attempt]`.
_MASK_STREAM = 0x41564C00  # 'AVL\0'
# Words after the seed in the one-off log-normal draw's key.
_LOGNORMAL_KEY = (0x41564C4E, 0, 1)  # 'AVLN'

ClientLabels = np.ndarray | Sequence[Iterable[int]]


def _check_int(name: str, value: object, minimum: int) -> int:
  if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
    raise ValueError(f'`{name}` must be an integer >= {minimum}, got {value!r}.')
  return int(value)


@dataclasses.dataclass(frozen=True, eq=False)
class Availability:
  """Per-round client availability of one mode; build with `build_availability`.

  Attributes:
    mode: One of `AVAILABILITY_MODES`.
    beta: The mode's heterogeneity parameter ``β``.
    seed: Seed of every draw (log-normal weights and masks).
    period: Period ``T`` in rounds (used by YC and SLN).
    num_labels: ``Y``, the number of labels (``None`` if no labels given).
    max_redraws: Most redraws `active` makes before raising.
    base_probabilities: float64[N], read-only: the round-independent factor
      (the whole probability except for YC and SLN; ``c_i / max_j c_j`` for
      SLN; ``1 − β`` for YC).
    label_membership: bool[N, Y], read-only, client ``i`` holds label ``y``
      (YC only, else ``None``).
  """

  mode: str
  beta: float
  seed: int
  period: int
  num_labels: int | None
  max_redraws: int
  base_probabilities: np.ndarray
  label_membership: np.ndarray | None

  @property
  def num_clients(self) -> int:
    """``N``, the number of clients."""
    return int(self.base_probabilities.size)

  @property
  def is_time_varying(self) -> bool:
    """Whether the probabilities depend on the round (YC, SLN)."""
    return self.mode in _TIME_VARYING_MODES

  def probabilities(self, round_num: int) -> np.ndarray:
    """Returns float64[N]: each client's probability of being active in a round.

    Args:
      round_num: The round ``t >= 0``.

    Raises:
      ValueError: If `round_num` is not a non-negative integer.
    """
    round_num = _check_int('round_num', round_num, 0)
    phase = 1 + round_num % self.period  # k ∈ {1, …, T}
    if self.mode == 'YC':
      # `build_availability` always sets both for YC.
      assert self.num_labels is not None and self.label_membership is not None
      in_phase = np.zeros(self.num_clients, dtype=bool)
      label = phase * self.num_labels // self.period  # ⌊k Y / T⌋, exact
      if label < self.num_labels:
        in_phase = self.label_membership[:, label]
      probs = self.beta * in_phase + self.base_probabilities
    elif self.mode == 'SLN':
      wave = 0.4 * math.sin(2.0 * math.pi * phase / self.period) + 0.5
      probs = self.base_probabilities * wave
    else:
      probs = self.base_probabilities.copy()
    return np.clip(probs, 0.0, 1.0)

  def active(self, round_num: int) -> tuple[np.ndarray, int]:
    """Returns round `round_num`'s availability mask and its number of redraws.

    Each client is active independently with its probability; an empty draw is
    redrawn from the next stream (see the module docstring for the keys).

    Args:
      round_num: The round ``t >= 0``.

    Returns:
      ``(mask, redraws)``: bool[N] with at least one True, and how many empty
      draws preceded it.

    Raises:
      ValueError: If `round_num` is not a non-negative integer.
      RuntimeError: If every probability is zero, or no client is active after
        `max_redraws` redraws.
    """
    probs = self.probabilities(round_num)
    if not np.any(probs > 0.0):
      raise RuntimeError(
        f'Availability mode {self.mode!r} with beta={self.beta!r} gives '
        f'every client probability 0 in round {round_num}: nobody can be '
        'active.'
      )
    for attempt in range(self.max_redraws + 1):
      rng = np.random.default_rng([self.seed, round_num, _MASK_STREAM + attempt])
      mask = rng.random(self.num_clients) < probs
      if mask.any():
        return mask, attempt
    raise RuntimeError(
      f'Availability mode {self.mode!r} with beta={self.beta!r}: no client '
      f'active in round {round_num} after {self.max_redraws} redraws '
      f'(largest probability {probs.max():.3g}).'
    )


def _label_sets(
  client_labels: ClientLabels, num_labels: int | None
) -> tuple[list[frozenset[int]], int]:
  """Returns each client's label set and ``Y``."""
  if isinstance(client_labels, np.ndarray) and client_labels.ndim == 2:
    histogram = client_labels
    if not np.issubdtype(histogram.dtype, np.number):
      raise ValueError(f'A label histogram must be numeric, got dtype {histogram.dtype}.')
    if np.any(histogram < 0) or not np.all(np.isfinite(histogram)):
      raise ValueError('A label histogram must be finite and non-negative.')
    if num_labels is not None and num_labels != histogram.shape[1]:
      raise ValueError(
        f"`num_labels`={num_labels} does not match the label histogram's "
        f'{histogram.shape[1]} columns.'
      )
    sets = [frozenset(np.flatnonzero(row).tolist()) for row in histogram]
    return sets, int(histogram.shape[1])
  sets = []
  for client, labels in enumerate(client_labels):
    labels = frozenset(labels)
    for label in labels:
      if isinstance(label, bool) or not isinstance(label, numbers.Integral) or label < 0:
        raise ValueError(f'Labels must be non-negative integers; client {client} has {label!r}.')
    sets.append(frozenset(int(label) for label in labels))
  largest = max((max(s) for s in sets if s), default=0)
  if num_labels is None:
    num_labels = largest + 1
  elif largest >= num_labels:
    raise ValueError(f'Label {largest} is outside 0..{num_labels - 1} (`num_labels`={num_labels}).')
  return sets, num_labels


def _check_mode_and_beta(mode: str, beta: float) -> float:
  """``β`` as a float, or ValueError for an unknown mode or a ``β`` the mode cannot take."""
  if mode not in AVAILABILITY_MODES:
    raise ValueError(
      f'Unknown availability mode {mode!r}; valid modes: {", ".join(AVAILABILITY_MODES)}.'
    )
  if isinstance(beta, bool) or not isinstance(beta, numbers.Real) or not 0.0 <= beta <= 1.0:
    raise ValueError(f'`beta` must be in [0, 1], got {beta!r}.')
  if mode in _LOGNORMAL_MODES and beta >= 1.0:
    raise ValueError(
      f'Mode {mode!r} needs `beta` < 1 (its log-normal sigma is ln(1/(1 - beta))), got {beta!r}.'
    )
  return float(beta)


def _check_sizes(client_sizes: np.ndarray | Sequence[int]) -> np.ndarray:
  """The client sizes as float64[N], or ValueError unless they are N > 0 positive numbers."""
  sizes = np.asarray(client_sizes)
  if sizes.ndim != 1 or sizes.size == 0:
    raise ValueError(f'`client_sizes` must be a non-empty 1-D array, got shape {sizes.shape}.')
  if not np.issubdtype(sizes.dtype, np.number) or np.issubdtype(sizes.dtype, np.complexfloating):
    raise ValueError(f'`client_sizes` must be numeric, got {sizes.dtype}.')
  sizes = sizes.astype(np.float64)
  if not np.all(np.isfinite(sizes)) or np.any(sizes <= 0):
    bad = sizes[~(np.isfinite(sizes) & (sizes > 0))]
    raise ValueError(f'`client_sizes` must be > 0, got {bad[0]!r}.')
  return sizes


def _checked_label_sets(
  mode: str, client_labels: ClientLabels | None, num_labels: int | None, num_clients: int
) -> tuple[list[frozenset[int]] | None, int | None]:
  """Each client's label set (``None`` without labels) and ``Y``, checked for `mode` and ``N``."""
  if client_labels is None:
    if mode in _LABEL_MODES:
      raise ValueError(f'Mode {mode!r} needs `client_labels`.')
    return None, num_labels
  label_sets, num_labels = _label_sets(client_labels, num_labels)
  if len(label_sets) != num_clients:
    raise ValueError(
      f'`client_labels` has {len(label_sets)} clients but `client_sizes` has {num_clients}.'
    )
  return label_sets, num_labels


def _base_probabilities(
  mode: str,
  beta: float,
  sizes: np.ndarray,
  label_sets: list[frozenset[int]] | None,
  num_labels: int | None,
  seed: int,
) -> tuple[np.ndarray, np.ndarray | None]:
  """`mode`'s ``Availability.base_probabilities`` and ``label_membership``, read-only."""
  num_clients = sizes.size
  membership = None
  if mode == 'IDL':
    base = np.ones(num_clients)
  elif mode == 'MDF':
    # (n_i / max n)^β == n_i^β / max n^β, without overflow for large n.
    base = (sizes / sizes.max()) ** beta
  elif mode == 'LDF':
    base = (sizes.min() / sizes) ** beta
  elif mode == 'YMF':
    assert label_sets is not None and num_labels is not None  # A label mode: checked.
    empty = [i for i, s in enumerate(label_sets) if not s]
    if empty:
      raise ValueError(f'Mode YMF needs labels for every client; client {empty[0]} has none.')
    max_label = num_labels - 1
    smallest = np.array([min(s) for s in label_sets], dtype=np.float64)
    ratio = smallest / max_label if max_label > 0 else np.zeros(num_clients)
    base = beta * ratio + (1.0 - beta)
  elif mode == 'YC':
    assert label_sets is not None and num_labels is not None  # A label mode: checked.
    membership = np.zeros((num_clients, num_labels), dtype=bool)
    for i, labels in enumerate(label_sets):
      membership[i, sorted(labels)] = True
    membership.setflags(write=False)
    base = np.full(num_clients, 1.0 - beta)
  elif mode in _LOGNORMAL_MODES:
    sigma = math.log(1.0 / (1.0 - beta))
    rng = np.random.default_rng([seed, *_LOGNORMAL_KEY])
    weights = rng.lognormal(0.0, sigma, num_clients)
    base = weights / weights.max()
  else:  # HOMO
    base = np.full(num_clients, 1.0 - beta)
  base = np.clip(base.astype(np.float64), 0.0, 1.0)
  base.setflags(write=False)
  return base, membership


def build_availability(
  mode: str,
  beta: float,
  *,
  client_sizes: np.ndarray | Sequence[int],
  client_labels: ClientLabels | None = None,
  seed: int,
  period: int = DEFAULT_PERIOD,
  num_labels: int | None = None,
  max_redraws: int = DEFAULT_MAX_REDRAWS,
) -> Availability:
  """Builds the availability model `mode` with parameter `beta`.

  Args:
    mode: One of `AVAILABILITY_MODES`: 'IDL', 'MDF', 'LDF', 'YMF', 'YC', 'LN',
      'SLN', 'HOMO'.
    beta: ``β ∈ [0, 1]``; LN and SLN need ``β < 1``. Ignored by IDL (but
      still checked).
    client_sizes: int[N], ``n_i > 0``, each client's number of examples.
    client_labels: Per client, the labels it holds: either a ``[N, Y]`` label
      histogram (a 2-D NumPy array; a label is held where its count is
      positive) or a sequence of ``N`` iterables of integer labels. Required
      by YMF and YC; checked against ``N`` whenever given.
    seed: Non-negative integer seed of every draw.
    period: ``T > 0``, the period in rounds of YC and SLN.
    num_labels: ``Y``; default: the histogram's width, else ``1 +`` the largest
      label held.
    max_redraws: Most redraws of an empty mask before `active` raises.

  Returns:
    An `Availability`.

  Raises:
    ValueError: On an unknown mode, ``β`` out of range, a size ``<= 0``,
      ``period <= 0``, mismatched lengths, missing or invalid labels.
  """
  beta = _check_mode_and_beta(mode, beta)
  seed = _check_int('seed', seed, 0)
  period = _check_int('period', period, 1)
  max_redraws = _check_int('max_redraws', max_redraws, 0)
  if num_labels is not None:
    num_labels = _check_int('num_labels', num_labels, 1)
  sizes = _check_sizes(client_sizes)
  label_sets, num_labels = _checked_label_sets(mode, client_labels, num_labels, sizes.size)
  base, membership = _base_probabilities(mode, beta, sizes, label_sets, num_labels, seed)
  return Availability(
    mode=mode,
    beta=beta,
    seed=seed,
    period=period,
    num_labels=num_labels,
    max_redraws=max_redraws,
    base_probabilities=base,
    label_membership=membership,
  )
