"""The one-line-per-round progress log, as a `tff.program` release manager."""

from __future__ import annotations

from collections.abc import Mapping
import math
from typing import Any

from absl import logging
import numpy as np
import tensorflow_federated as tff


class ProgressReleaseManager(tff.program.ReleaseManager):
  """Logs one line per round: round, seconds, ETA, loss, accuracy, bits."""

  def __init__(self, total_rounds: int):
    self._total_rounds = total_rounds
    self._round_seconds: list[float] = []

  async def release(self, value: Mapping[str, Any], key: int) -> None:
    parts = [f'round {key:>{len(str(self._total_rounds))}}/{self._total_rounds}']
    if 'round_seconds' in value:
      seconds = float(value['round_seconds'])
      self._round_seconds.append(seconds)
      eta = float(np.median(self._round_seconds)) * (self._total_rounds - key)
      parts.append(f'{seconds:6.2f}s  ETA {_format_duration(eta)}')
    train = value.get('train', {})
    if 'loss' in train:
      parts.append(f'train loss {train["loss"]:.4f} acc {train.get("accuracy", math.nan):.4f}')
    evaluation = value.get('eval', {})
    if 'accuracy' in evaluation:
      parts.append(f'eval loss {evaluation["loss"]:.4f} acc {evaluation["accuracy"]:.4f}')
    uplink = value.get('uplink', {})
    if 'cumulative_bits' in uplink:
      parts.append(f'uploaded {float(uplink["cumulative_bits"]):.3g} bits')
    logging.info(' | '.join(parts))


def _format_duration(seconds: float) -> str:
  seconds = int(round(seconds))
  return f'{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}'
