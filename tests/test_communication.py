"""Tests for tff_sampling/communication.py."""

import collections

import numpy as np
import pytest
import tensorflow_federated as tff

from tff_sampling import communication


def test_upload_bits_hand_computed():
  # 3 uploads of a 1,000-parameter model plus 32 × 9 protocol scalars, 32 bits each.
  uplink = communication.Uplink(model_uploads=3, extra_scalars=32 * 9)
  assert communication.upload_bits(uplink, 1000) == 32 * (3 * 1000 + 288) == 105_216


def test_upload_bits_other_width():
  assert communication.upload_bits(communication.Uplink(2, 1), 10, bits_per_value=8) == 8 * 21


@pytest.mark.parametrize(
  'uplink,params,match',
  [
    (communication.Uplink(-1, 0), 10, 'non-negative'),
    (communication.Uplink(1, -2), 10, 'non-negative'),
    (communication.Uplink(1, 0), 0, 'model_parameters must be positive'),
  ],
)
def test_upload_bits_rejects_bad_counts(uplink, params, match):
  with pytest.raises(ValueError, match=match):
    communication.upload_bits(uplink, params)


def test_count_parameters_counts_trainable_only():
  weights = tff.learning.models.ModelWeights(
    trainable=[np.zeros((64, 10)), np.zeros(10)], non_trainable=[np.zeros(1000)]
  )
  assert communication.count_parameters(weights) == 650
  assert communication.count_parameters(collections.OrderedDict(a=np.zeros((2, 3)))) == 6


def test_full_cohort_uplink():
  assert communication.full_cohort_uplink({}, 32) == communication.Uplink(32, 0)
