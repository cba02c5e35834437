"""Smoke test of bench/lefl.py: `run` on tiny sizes, the table and `main`."""

import dataclasses
import math

from absl.testing import flagsaver
import numpy as np
import pytest

from bench import lefl as bench_lefl


def test_run_tiny_sizes():
  rows = bench_lefl.run([30, 60], repeats=1, seed=0)
  assert [row.num_clients for row in rows] == [30, 60]
  for row in rows:
    seconds = (row.kl_seconds, row.cluster_seconds, row.setup_seconds, row.select_seconds)
    assert all(math.isfinite(value) and value > 0 for value in seconds), row
    assert row.setup_seconds == pytest.approx(row.kl_seconds + row.cluster_seconds)
    assert 1 <= row.num_clusters <= math.ceil(math.log2(row.num_clients))
    assert 1 <= row.cohort_size <= row.num_clients
  with pytest.raises(dataclasses.FrozenInstanceError):
    rows[0].kl_seconds = 0.0  # type: ignore[misc]
  table = bench_lefl.format_table(rows)
  assert len(table.splitlines()) == 2 + len(rows)
  assert table.splitlines()[-1].split()[0] == '60'


def test_soft_labels_are_seeded_probabilities():
  labels = bench_lefl.soft_labels(20, public_examples=7, labels=5, concentration=0.5, seed=3)
  assert labels.shape == (20, 7, 5)
  assert np.all(labels >= 0)
  np.testing.assert_allclose(labels.sum(axis=2), 1.0)
  np.testing.assert_array_equal(
    labels, bench_lefl.soft_labels(20, public_examples=7, labels=5, concentration=0.5, seed=3)
  )


def test_main_prints_the_table(capsys):
  with flagsaver.flagsaver(lf_sizes=['20'], lf_repeats=1, lf_public_examples=10):
    bench_lefl.main(['lefl'])
  out = capsys.readouterr().out
  assert 'cluster_s' in out and '\n    20 ' in out
