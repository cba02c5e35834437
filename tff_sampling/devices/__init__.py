"""Client devices and time: each client's compute speed and bandwidths (`profiles`); what they
make of a round (`timing`): each selected client's download, training and upload seconds, who
is kept (the first to finish, within a deadline; drop-outs never finish) and how long the round
lasts; and a run's system model (`system`), which the round loop applies. Pure NumPy,
deterministic from (seed, round, client); it imports only `tff_sampling.randomness` and
`tff_sampling.validation`. The model and its parameters are in ``docs/devices.md``."""

from tff_sampling.devices.profiles import DeviceProfiles
from tff_sampling.devices.profiles import LogNormalDevices
from tff_sampling.devices.profiles import read_profiles
from tff_sampling.devices.system import SystemModel
from tff_sampling.devices.system import overcommitted
from tff_sampling.devices.timing import ClientSeconds
from tff_sampling.devices.timing import RoundTime
from tff_sampling.devices.timing import client_seconds
from tff_sampling.devices.timing import dropped_out
from tff_sampling.devices.timing import keep_first
from tff_sampling.devices.timing import round_seconds

__all__ = [
  'ClientSeconds',
  'DeviceProfiles',
  'LogNormalDevices',
  'RoundTime',
  'SystemModel',
  'client_seconds',
  'dropped_out',
  'keep_first',
  'overcommitted',
  'read_profiles',
  'round_seconds',
]
