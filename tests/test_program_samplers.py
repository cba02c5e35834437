"""The program loop with stateful samplers, per-client signals and the loss probe."""

import csv
import os
from typing import NamedTuple

import numpy as np
import pytest

from tff_sampling import program
from tff_sampling import samplers
from tff_sampling.learning import signals

_SKETCH = 64


class _State(NamedTuple):
  sketch_norms: np.ndarray  # float64[N]: the last observed sketch norm per client.
  seen: np.ndarray  # int64[N]: participations.


class _SignalDrivenSampler(samplers.Sampler):
  """Chooses the clients with the largest remembered sketch norms (state-driven)."""

  needs_signals = frozenset({'update_sketch'})

  def __init__(self, k):
    self.k = k
    self.observed = []

  def initialize(self, population):
    return _State(np.zeros(population.size), np.zeros(population.size, np.int64))

  def select(self, state, round_num, available):
    # Unseen clients first (by index), then the largest remembered norms.
    order = np.lexsort((np.arange(state.seen.size), -state.sketch_norms, state.seen > 0))
    clients = order[: self.k]
    return samplers.Selection(clients=clients, weights=np.full(self.k, 1.0 / self.k))

  def observe(self, state, selection, round_signals):
    sketches = round_signals['update_sketch']
    assert sketches.shape == (len(selection.clients), _SKETCH)
    self.observed.append(sketches)
    norms = state.sketch_norms.copy()
    norms[selection.clients] = np.linalg.norm(sketches, axis=1)
    seen = state.seen.copy()
    seen[selection.clients] += 1
    return _State(norms, seen)


def _rows(path):
  with open(os.path.join(path, 'metrics.csv')) as f:
    rows = list(csv.DictReader(f))
  for row in rows:
    row.pop('round_seconds')
  return rows


@pytest.fixture(scope='module')
def signals_process(small_digits_task):
  return signals.build_fed_avg_with_signals(
    small_digits_task.model_fn, client_learning_rate=0.1, sketch_size=_SKETCH
  )


def _config(path, rounds, **kwargs):
  return program.RunConfig(
    output_dir=str(path), rounds=rounds, seed=0, hparams={'seed': 0}, **kwargs
  )


def test_signals_reach_the_sampler_not_the_csv(small_digits_task, signals_process, tmp_path):
  sampler = _SignalDrivenSampler(4)
  program.train_model(small_digits_task, signals_process, sampler, _config(tmp_path, 2))
  assert [s.shape for s in sampler.observed] == [(4, _SKETCH), (4, _SKETCH)]
  assert np.all(np.linalg.norm(sampler.observed[0], axis=1) > 0)
  header = _rows(tmp_path)[0].keys()
  assert not [k for k in header if 'signals' in k or 'sketch' in k]
  assert all(r['cohort_size'] == '4' for r in _rows(tmp_path)[1:])


def test_a_sampler_needing_a_signal_the_process_lacks_is_refused_before_writing(
  small_digits_task, tmp_path
):
  plain = signals.build_fed_avg_with_signals(
    small_digits_task.model_fn, client_learning_rate=0.1, sketch_size=None
  )
  with pytest.raises(
    ValueError,
    match=r"_SignalDrivenSampler reads .*\['update_sketch'\].*"
    'sketch_size',
  ):
    program.train_model(
      small_digits_task, plain, _SignalDrivenSampler(4), _config(tmp_path / 'run', 1)
    )
  assert not os.path.exists(tmp_path / 'run')


def test_stateful_sampler_resumes_identically(small_digits_task, signals_process, tmp_path):
  full = program.train_model(
    small_digits_task,
    signals_process,
    _SignalDrivenSampler(4),
    _config(tmp_path / 'full', 6, checkpoint_every=2),
  )
  program.train_model(
    small_digits_task,
    signals_process,
    _SignalDrivenSampler(4),
    _config(tmp_path / 'part', 4, checkpoint_every=2),
  )
  resumed = program.train_model(
    small_digits_task,
    signals_process,
    _SignalDrivenSampler(4),
    _config(tmp_path / 'part', 6, checkpoint_every=2),
  )
  assert resumed.resumed_from == 4
  # From round 5 on, the choices depend on the restored sampler state.
  assert _rows(tmp_path / 'part') == _rows(tmp_path / 'full')
  for a, b in zip(full.model_weights.trainable, resumed.model_weights.trainable):
    np.testing.assert_array_equal(a, b)


def test_power_of_choice_through_the_program(small_digits_task, tmp_path):
  from tff_sampling import learning

  process = learning.build_fed_avg(small_digits_task.model_fn, client_learning_rate=0.1)
  sampler = samplers.PowerOfChoiceSampler(3, num_candidates=8, seed=0)
  chosen = []
  original = sampler.select

  def recording_select(*args, **kwargs):
    probe = kwargs['probe']
    candidates = sampler.candidates(args[0], args[1], args[2])
    losses = probe(candidates)
    selection = original(*args, **kwargs)
    chosen.append((candidates, losses, selection.clients))
    return selection

  sampler.select = recording_select
  program.train_model(small_digits_task, process, sampler, _config(tmp_path, 2))
  for candidates, losses, clients in chosen:
    assert len(set(candidates.tolist())) == 8 and len(clients) == 3
    top = set(candidates[np.argsort(-losses, kind='stable')[:3]].tolist())
    assert set(clients.tolist()) == top
    assert np.all(np.isfinite(losses)) and np.all(losses > 0)


class _EveryOtherRound:
  """Clients 0-9 are active in odd rounds, 10-19 in even rounds (one redraw each)."""

  def active(self, round_num):
    mask = np.zeros(20, bool)
    mask[:10] = round_num % 2 == 1
    mask[10:] = round_num % 2 == 0
    return mask, 1


@pytest.mark.parametrize(
  'make_sampler',
  [
    lambda: samplers.UniformSampler(4, seed=0),
    lambda: samplers.MDSampler(4, seed=0),
    lambda: samplers.ClusteredSampler(4, seed=0, method='size'),
  ],
)
def test_every_sampler_selects_only_active_clients(
  small_digits_task, signals_process, tmp_path, make_sampler
):
  program.train_model(
    small_digits_task,
    signals_process,
    make_sampler(),
    _config(tmp_path, 3),
    availability=_EveryOtherRound(),
  )
  rows = _rows(tmp_path)[1:]
  assert [r['availability/active_clients'] for r in rows] == ['10'] * 3
  assert [r['availability/redraws'] for r in rows] == ['1'] * 3


def test_a_sampler_that_ignores_availability_is_caught(
  small_digits_task, signals_process, tmp_path
):
  class Careless(samplers.UniformSampler):
    def select(self, state, round_num, available):
      return super().select(state, round_num, np.ones_like(available))

  with pytest.raises(RuntimeError, match='Careless selected inactive clients in round 1'):
    program.train_model(
      small_digits_task,
      signals_process,
      Careless(4, seed=0),
      _config(tmp_path, 1),
      availability=_EveryOtherRound(),
    )
