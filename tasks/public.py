"""Public unlabeled inputs for LEFL's soft labels: Gaussian noise (offline), held-out real
LEAF writers, or a TFDS dataset; ``docs/tasks.md`` has the details."""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from tensorflow_federated.python.simulation.baselines.cifar100 import (
  image_classification_preprocessing,
)

from tasks import _common
from tasks import leaf_json
from tasks import shakespeare
from tff_sampling.learning import graph_probe
from tff_sampling.task import Task

SOURCES = ('noise', 'fashion_mnist', 'leaf_femnist', 'cifar10')
# Preprocessed evaluation inputs whose mean and covariance the 'noise' source takes.
NOISE_MOMENT_EXAMPLES = 1024
# Stream of `np.random.default_rng([seed, _PUBLIC_STREAM])` ('PUBL').
_PUBLIC_STREAM = 0x5055424C
_READ_BATCH = 10_000


def _task_input_spec(task: Task) -> tf.TensorSpec:
  return graph_probe.model_inputs_spec(task.element_spec)


def _unmappable(source: str, task: Task, source_shape, reason: str) -> ValueError:
  spec = _task_input_spec(task)
  return ValueError(
    f'Public source {source!r} (examples of shape {source_shape}) cannot be mapped to task '
    f'{task.name!r}, whose model takes {spec.dtype.name} examples of shape '
    f"{tuple(spec.shape[1:].as_list())}: {reason}. Use source='noise', which fits every "
    'task.'
  )


def _load_train_images(name: str, data_dir: str | None) -> np.ndarray:
  """All ``uint8`` training images of TFDS dataset `name`, in TFDS order."""
  dataset = _common.load_tfds(
    name,
    data_dir,
    user=f'The public source {name!r}',
    alternative="; or use source='noise'",
    split='train',
  )
  batches = [
    batch['image']
    for batch in dataset.map(lambda e: {'image': e['image']}).batch(_READ_BATCH).as_numpy_iterator()
  ]
  return np.concatenate(batches).astype(np.uint8, copy=False)


def _subset(
  images: np.ndarray, num_examples: int, rng: np.random.Generator, source: str
) -> np.ndarray:
  if num_examples > len(images):
    raise ValueError(
      f'num_examples={num_examples} exceeds the {len(images)} training images of '
      f'{source!r}; ask for at most {len(images)}.'
    )
  return images[np.sort(rng.choice(len(images), num_examples, replace=False))]


def _fashion_mnist(
  task: Task, num_examples: int, rng: np.random.Generator, data_dir: str | None
) -> np.ndarray:
  source_shape = (28, 28, 1)
  if task.name == 'digits':
    convert = lambda pixels: tf.reshape(
      tf.image.resize(pixels, (8, 8), method='area'), [-1, 64]
    ).numpy()
  elif task.name == 'emnist' or task.name.startswith('emnist_unbalanced'):
    convert = lambda pixels: 1.0 - pixels  # TFF's EMNIST: 1.0 is the background.
  else:
    raise _unmappable(
      'fashion_mnist',
      task,
      source_shape,
      'it maps only to the grey-scale digit tasks digits and emnist*',
    )
  images = _subset(
    _load_train_images('fashion_mnist', data_dir), num_examples, rng, 'fashion_mnist'
  )
  return np.asarray(convert(images.astype(np.float32) / 255.0), np.float32)


def _leaf_femnist(
  task: Task, num_examples: int, rng: np.random.Generator, data_dir: str | None
) -> np.ndarray:
  source_shape = leaf_json.FEMNIST_IMAGE_SHAPE + (1,)
  if not (task.name == 'emnist' or task.name.startswith('emnist_unbalanced')):
    raise _unmappable('leaf_femnist', task, source_shape, 'it maps only to emnist*')
  if data_dir is None:
    raise ValueError(
      "The public source 'leaf_femnist' needs data_dir: a LEAF FEMNIST folder "
      '(train/, test/) of writers who are not clients of the task.'
    )
  writers = leaf_json.read_leaf(data_dir, 'femnist')['train']
  shared = sorted(set(writers) & set(task.client_ids))
  if shared:
    raise ValueError(
      f'The public writers in {data_dir} include {len(shared)} client(s) of the task (e.g. '
      f"{shared[0]!r}); the public set must not be any client's data: convert the population "
      'without these writers (bin.convert_leaf on the other LEAF files).'
    )
  images = np.concatenate([features['pixels'] for features in writers.values()])
  return _subset(images, num_examples, rng, 'leaf_femnist')[..., np.newaxis]


def _cifar10(
  task: Task, num_examples: int, rng: np.random.Generator, data_dir: str | None
) -> np.ndarray:
  source_shape = (32, 32, 3)
  if task.name == 'cifar10':
    raise _unmappable(
      'cifar10',
      task,
      source_shape,
      "the public set must come from another distribution than the task's, "
      "and these would be the clients' own training images",
    )
  if task.name != 'cifar100':
    raise _unmappable('cifar10', task, source_shape, 'it maps only to cifar100')
  crop = int(task.options['crop_size'])
  image_map = image_classification_preprocessing.build_image_map((crop, crop, 3), distort=False)
  images = _subset(_load_train_images('cifar10', data_dir), num_examples, rng, 'cifar10')
  inputs, _ = image_map({'image': tf.constant(images), 'label': tf.zeros([len(images)])})
  return np.asarray(inputs, np.float32)


def _noise(task: Task, num_examples: int, rng: np.random.Generator) -> np.ndarray:
  spec = _task_input_spec(task)
  example_shape = tuple(spec.shape[1:].as_list())
  if spec.dtype.is_floating:
    inputs = graph_probe.validation_inputs(task, NOISE_MOMENT_EXAMPLES)
    return graph_probe.noise_batch(inputs, num_examples, seed=rng.integers(2**63 - 1)).astype(
      spec.dtype.as_numpy_dtype
    )
  if not spec.dtype.is_integer:
    raise _unmappable(
      'noise',
      task,
      example_shape,
      f'inputs of dtype {spec.dtype.name} are neither real nor token ids',
    )
  if task.name == 'shakespeare':
    low, high = 1, len(shakespeare.VOCAB) + 1  # The characters, without special tokens.
  else:
    low, high = 0, task.num_classes
  return rng.integers(low, high, (num_examples,) + example_shape).astype(spec.dtype.as_numpy_dtype)


def public_inputs(
  task: Task, source: str, *, num_examples: int, seed: int, data_dir: str | None = None
) -> np.ndarray:
  """A public, unlabeled set of `num_examples` model inputs for `task` (module docstring).

  Args:
    task: The task whose model the inputs feed.
    source: One of `SOURCES`.
    num_examples: ``P``, the number of public examples (≥ 1; LEFL uses
      ~100–1,000; at most the source's training images).
    seed: Seed of the noise or of the subset.
    data_dir: TFDS data directory of the prepared source (``None``: TFDS's
      default); for ``'leaf_femnist'`` the LEAF FEMNIST folder (required);
      unused for ``'noise'``.

  Returns:
    ``[num_examples, *input_shape]`` inputs, ``input_shape`` being the task's
    ``element_spec`` ``x`` without the batch dimension: ``float32`` for
    real-valued inputs, the task's integer dtype for token ids.

  Raises:
    ValueError: For an unknown source, a source that does not map to the
      task's inputs, or an invalid `num_examples`.
    FileNotFoundError: If a TFDS source is not prepared in `data_dir`.
  """
  if source not in SOURCES:
    raise ValueError(f'source must be one of {list(SOURCES)}, got {source!r}.')
  if (
    isinstance(num_examples, (bool, np.bool_))
    or not isinstance(num_examples, (int, np.integer))
    or num_examples <= 0
  ):
    raise ValueError(f'num_examples must be a positive integer, got {num_examples!r}.')
  num_examples = int(num_examples)
  if data_dir is not None and not isinstance(data_dir, str):
    raise ValueError(f'data_dir must be a string or None, got {data_dir!r}.')
  rng = np.random.default_rng([int(seed), _PUBLIC_STREAM])
  if source == 'noise':
    inputs = _noise(task, num_examples, rng)
  elif source == 'fashion_mnist':
    inputs = _fashion_mnist(task, num_examples, rng, data_dir)
  elif source == 'leaf_femnist':
    inputs = _leaf_femnist(task, num_examples, rng, data_dir)
  else:
    inputs = _cifar10(task, num_examples, rng, data_dir)
  spec = _task_input_spec(task)
  expected = (num_examples,) + tuple(spec.shape[1:].as_list())
  if inputs.shape != expected:  # A mapping that no longer fits its task.
    raise _unmappable(
      source, task, inputs.shape[1:], f'the mapping gave {inputs.shape} instead of {expected}'
    )
  return inputs
