"""Tests for tff_sampling/devices: the device profiles and the round timing, against hand
computations."""

import numpy as np
import pytest

from tff_sampling import communication
from tff_sampling import devices


def _profiles():
  # Three clients: seconds per example, download and upload bits per second.
  return devices.DeviceProfiles(
    np.array([0.01, 0.02, 0.1]), np.array([8e6, 4e6, 1e6]), np.array([2e6, 1e6, 0.5e6])
  )


def test_client_seconds_by_hand():
  # Model of 4 Mbit down; clients 2 and 0 train 100 and 300 examples and upload 4 Mbit and 0:
  # client 2: 4e6/1e6 = 4 s down, 100 × 0.1 = 10 s training, 4e6/0.5e6 = 8 s up;
  # client 0: 0.5 s down, 3 s training, 0 s up.
  seconds = devices.client_seconds(
    _profiles(),
    np.array([2, 0]),
    np.array([100, 300]),
    download_bits=4e6,
    upload_bits=np.array([4e6, 0.0]),
  )
  np.testing.assert_allclose(seconds.download, [4.0, 0.5])
  np.testing.assert_allclose(seconds.train, [10.0, 3.0])
  np.testing.assert_allclose(seconds.upload, [8.0, 0.0])
  np.testing.assert_allclose(seconds.until_trained, [14.0, 3.5])


def test_keep_first_with_overcommitment_deadline_and_dropouts():
  finish = np.array([5.0, 1.0, 3.0, 3.0, 9.0])
  # Over-commitment: 5 selected, the first 3 kept; 2 and 3 tie at 3 s (cohort order).
  kept = devices.keep_first(finish, 3)
  assert kept.kept.tolist() == [False, True, True, True, False] and kept.seconds == 3.0
  # Client 1 drops out: the next to finish (client 0, 5 s) takes its place.
  dropped = np.array([False, True, False, False, False])
  kept = devices.keep_first(finish, 3, dropped=dropped)
  assert kept.kept.tolist() == [True, False, True, True, False] and kept.seconds == 5.0
  assert kept.finish.tolist() == [5.0, np.inf, 3.0, 3.0, 9.0]  # A drop-out never finishes.
  # A 4 s deadline leaves 2 of the 3 wanted: the server waits until the deadline.
  kept = devices.keep_first(finish, 3, deadline=4.0, dropped=dropped)
  assert kept.kept.tolist() == [False, False, True, True, False] and kept.seconds == 4.0
  # No deadline, fewer finishers than wanted: the round ends with the last of them.
  kept = devices.keep_first(finish, 5, dropped=dropped)
  assert kept.kept.sum() == 4 and kept.seconds == 9.0
  with pytest.raises(ValueError, match='target must be a positive integer, got 0'):
    devices.keep_first(finish, 0)
  with pytest.raises(ValueError, match='deadline must be a positive number of seconds, got -1'):
    devices.keep_first(finish, 1, deadline=-1.0)


def test_two_phase_round_pays_uploads_only_for_the_uploaders():
  upload = np.array([4.0, 1.0, 9.0])
  # The kept clients' norms are in at 6 s; only client 1 uploads (1 s).
  assert devices.round_seconds(6.0, upload, np.array([False, True, False])) == 7.0
  # Client 2's slow upload (9 s) counts only if it uploads.
  assert devices.round_seconds(6.0, upload, np.array([False, True, True])) == 15.0
  assert devices.round_seconds(6.0, upload, np.zeros(3, bool)) == 6.0
  with pytest.raises(ValueError, match='3 upload times for 2 upload flags'):
    devices.round_seconds(6.0, upload, np.array([False, True]))


def test_two_phase_round_keeps_the_first_to_have_their_update():
  profiles = devices.DeviceProfiles(
    seconds_per_example=np.array([1.0, 1.0, 1.0]),
    download_bits_per_second=np.array([10.0, 10.0, 10.0]),
    upload_bits_per_second=np.array([1.0, 10.0, 5.0]),
  )
  # Trained at 1 + 3 = 4 s, 1 + 5 = 6 s, 1 + 2 = 3 s; uploads of 10 bits take 10, 1 and 2 s.
  system = devices.SystemModel(profiles, np.array([3.0, 5.0, 2.0]), model_bits=10.0, target=2)
  clients = np.arange(3)
  # One phase: done at 14, 7 and 5 s: clients 1 and 2 are kept, the round lasts 7 s.
  one_phase = system.round(0, 1, clients)
  assert one_phase.kept.tolist() == [False, True, True] and one_phase.seconds == 7.0
  # Two phases: trained first are clients 2 (3 s) and 0 (4 s); uploads come after.
  two_phase = system.round(0, 1, clients, uploads_after_training=True)
  assert two_phase.kept.tolist() == [True, False, True] and two_phase.seconds == 4.0
  np.testing.assert_allclose(system.upload_seconds(np.array([0, 2])), [10.0, 2.0])


def test_dropouts_depend_on_seed_round_and_client_only():
  everyone = np.arange(200)
  fates = devices.dropped_out(3, 7, everyone, 0.1)
  # A client's fate is the same whoever else was selected, and repeats for the same round.
  np.testing.assert_array_equal(devices.dropped_out(3, 7, np.array([150, 4]), 0.1), fates[[150, 4]])
  assert not np.array_equal(devices.dropped_out(3, 8, everyone, 0.1), fates)
  # 200 Bernoulli(0.1): 20 expected, sd 4.2; 4.5 sd either side (two-sided p < 1e-5).
  assert abs(fates.sum() - 20) < 4.5 * np.sqrt(200 * 0.1 * 0.9)
  assert not devices.dropped_out(3, 7, everyone, 0.0).any()
  with pytest.raises(ValueError, match=r'dropout probability must be in \[0, 1\), got 1.0'):
    devices.dropped_out(3, 7, everyone, 1.0)


def test_lognormal_devices_are_reproducible_and_have_the_stated_medians():
  spec = devices.LogNormalDevices()
  a, b = spec.draw(4000, seed=5), spec.draw(4000, seed=5)
  for x, y in zip(a, b):
    np.testing.assert_array_equal(x, y)
  assert not np.array_equal(spec.draw(4000, seed=6).seconds_per_example, a.seconds_per_example)
  # log(value) ~ N(log median, σ²): the sample mean of 4,000 logs is within 4.5 standard
  # errors of log median (two-sided p < 1e-5 each), and the sample sd within 10% of σ.
  for values, median, sigma in (
    (a.seconds_per_example, spec.median_seconds_per_example, spec.compute_sigma),
    (a.download_bits_per_second, spec.median_download_bits_per_second, spec.download_sigma),
    (a.upload_bits_per_second, spec.median_upload_bits_per_second, spec.upload_sigma),
  ):
    logs = np.log(values)
    assert abs(logs.mean() - np.log(median)) < 4.5 * sigma / np.sqrt(values.size)
    assert abs(logs.std(ddof=1) / sigma - 1) < 0.1
  # σ = 0: every device is the median.
  flat = devices.LogNormalDevices(compute_sigma=0.0).draw(3, seed=1)
  np.testing.assert_allclose(flat.seconds_per_example, 0.01)
  with pytest.raises(ValueError, match='compute_sigma must be a non-negative number, got -1'):
    devices.LogNormalDevices(compute_sigma=-1)
  with pytest.raises(ValueError, match='median_upload_bits_per_second'):
    devices.LogNormalDevices(median_upload_bits_per_second=0)


def test_read_profiles(tmp_path):
  path = tmp_path / 'devices.csv'
  path.write_text(
    'upload_bits_per_second,seconds_per_example,download_bits_per_second,phone\n'
    '2e6,0.01,8e6,a\n1e6,0.02,4e6,b\n'
  )
  profiles = devices.read_profiles(str(path), 2)
  np.testing.assert_array_equal(profiles.seconds_per_example, [0.01, 0.02])
  np.testing.assert_array_equal(profiles.upload_bits_per_second, [2e6, 1e6])
  with pytest.raises(ValueError, match='2 rows of clients for a population of 3'):
    devices.read_profiles(str(path), 3)
  path.write_text('seconds_per_example,download_bits_per_second\n0.1,1e6\n')
  with pytest.raises(ValueError, match='no column upload_bits_per_second; the header must name'):
    devices.read_profiles(str(path), 1)
  path.write_text(
    'seconds_per_example,download_bits_per_second,upload_bits_per_second\n0.1,fast,1e6\n'
  )
  with pytest.raises(ValueError, match="download_bits_per_second of client 0 is 'fast'"):
    devices.read_profiles(str(path), 1)
  path.write_text('seconds_per_example,download_bits_per_second,upload_bits_per_second\n0,1,1\n')
  with pytest.raises(ValueError, match='seconds_per_example of client 0 is 0.0; every value'):
    devices.read_profiles(str(path), 1)


def test_uploaded_slots_match_fingerprints_as_a_multiset():
  slots = np.array([7, 3, 9, 3, 5])
  np.testing.assert_array_equal(
    communication.uploaded_slots(slots, np.array([9, 7])), [True, False, True, False, False]
  )
  # Two slots share fingerprint 3 (identical updates): as many as uploaded, in slot order.
  np.testing.assert_array_equal(
    communication.uploaded_slots(slots, np.array([3, 5])), [False, True, False, False, True]
  )
  np.testing.assert_array_equal(
    communication.uploaded_slots(slots, np.array([3, 3])), [False, True, False, True, False]
  )
  assert not communication.uploaded_slots(slots, np.zeros(0, np.int64)).any()
  with pytest.raises(ValueError, match='1 upload.s. with fingerprint 4 but 0 cohort slot'):
    communication.uploaded_slots(slots, np.array([4]))
