"""requirements/gpu.txt pins what the installed TensorFlow's `and-cuda` extra pins."""

import importlib.metadata
import os
import re

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _gpu_pins() -> dict[str, str]:
  pins = {}
  with open(os.path.join(_REPO, 'requirements', 'gpu.txt')) as f:
    for line in f:
      line = line.split('#')[0].strip()
      if line:
        name, version = line.split('==')
        pins[name] = version
  return pins


def test_gpu_requirements_are_tensorflows_cuda_extra_without_tensorrt():
  extra = {}
  for requirement in importlib.metadata.requires('tensorflow') or []:
    match = re.match(r'^([\w.-]+) ?\(?==([\w.]+)\)? ?; extra == .and-cuda.$', requirement)
    if match:
      extra[match[1]] = match[2]
  assert extra.pop('tensorrt') == '8.5.3.1'  # Not on the public index: left out, documented.
  assert len(extra) == 10
  assert _gpu_pins() == extra
