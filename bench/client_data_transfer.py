r"""Benchmark: client data sent from Python with every call vs read by TFF's worker from files.

    .venv/bin/python -m bench.client_data_transfer --cdt_leaf_dir=<LEAF FEMNIST folder>
    .venv/bin/python -m bench.client_data_transfer --cdt_leaf_dir=<folder> --cdt_pairs=15
    .venv/bin/python -m bench.client_data_transfer --cdt_leaf_dir=<folder> --cdt_model=2nn

One TFF call maps a small client computation over the first ``--cdt_clients`` writers of a
LEAF FEMNIST folder (every writer's training examples, batched by 20) and sums what the
clients return: the number of examples and the sum of their pixels. No model trains, so
the call measures how the clients' data reaches TFF's worker:

* ``python``: each client's ``tf.data.Dataset`` built in Python (from its arrays, as the
  in-memory tasks build them) and passed to the call, serialised with it every call;
* ``files``: each client's arrays written once, before timing, as serialised tensors in a
  temporary folder; the call passes each client's file prefix, and the client computation
  reads and batches them inside the worker.

With ``--cdt_model`` the call is instead one round of example-weighted FedAvg of that model
(`bench.fedavg_round`'s ``DATASET_ITERATOR`` round; the ``files`` side composes the reading
computation with the process, `tff.simulation.compose_dataset_computation_with_learning_process`),
timed beside the plain-TF loop of `bench.fedavg_workload`; the two FedAvg sides must train
identical weights.

Both sides must return the same counts and pixel sums (exactly) before timing. The sides
then alternate in blocks (`bench.stats.interleave`) after a warm-up block; the table gives
each side's median seconds a call and the median per-pair ratio ``files / python`` with
its 95% bootstrap interval.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
import os
import tempfile

from absl import app
from absl import flags
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from bench import fedavg_workload
from bench import stats

_LEAF_DIR = flags.DEFINE_string('cdt_leaf_dir', None, 'A LEAF FEMNIST folder (train/, test/).')
_CLIENTS = flags.DEFINE_integer('cdt_clients', 105, 'Writers in the call.', lower_bound=1)
_PAIRS = flags.DEFINE_integer('cdt_pairs', 9, 'Timed blocks (pairs).', lower_bound=2)
_MODEL = flags.DEFINE_enum(
  'cdt_model',
  None,
  list(fedavg_workload.MODELS),
  'Time one FedAvg round of this model (DATASET_ITERATOR, client SGD 0.1) with each side, '
  'beside the plain-TF loop, instead of the call that only counts.',
)
_BATCH_SIZE = 20


def _totals(dataset: tf.data.Dataset) -> collections.OrderedDict:
  """The examples and the float64 sum of the pixels of a batched client dataset."""
  count, pixels = dataset.reduce(
    (np.int64(0), np.float64(0.0)),
    lambda totals, batch: (
      totals[0] + tf.shape(batch['y'], out_type=tf.int64)[0],
      totals[1] + tf.reduce_sum(tf.cast(batch['x'], tf.float64)),
    ),
  )
  return collections.OrderedDict(examples=count, pixel_sum=pixels)


def from_python(element_spec) -> tff.Computation:
  """The call with the clients' datasets as its argument."""

  @tff.tensorflow.computation(tff.SequenceType(tff.types.tensorflow_to_type(element_spec)))
  def client_totals(dataset):
    return _totals(dataset)

  @tff.federated_computation(tff.FederatedType(client_totals.type_signature.parameter, tff.CLIENTS))
  def call(datasets):
    return tff.federated_sum(tff.federated_map(client_totals, datasets))

  return call


def write_client_files(arrays: Sequence, folder: str) -> list[str]:
  """Writes each client's ``x`` and ``y`` as serialised tensors; returns the file prefixes."""
  prefixes = []
  for index, client in enumerate(arrays):
    prefix = os.path.join(folder, f'client_{index}_')
    for key in ('x', 'y'):
      tf.io.write_file(prefix + key, tf.io.serialize_tensor(client[key]))
    prefixes.append(prefix)
  return prefixes


def _read_client(prefix) -> tf.data.Dataset:
  """A client's batched dataset from the two files `write_client_files` wrote (in TF)."""
  x = tf.io.parse_tensor(tf.io.read_file(prefix + 'x'), tf.float32)
  y = tf.io.parse_tensor(tf.io.read_file(prefix + 'y'), tf.int32)
  x.set_shape([None, *fedavg_workload.IMAGE_SHAPE])
  y.set_shape([None])
  return tf.data.Dataset.from_tensor_slices(collections.OrderedDict(x=x, y=y)).batch(_BATCH_SIZE)


def from_files() -> tff.Computation:
  """The call with each client's file prefix as its argument; the worker reads the files."""

  @tff.tensorflow.computation(tff.TensorType(np.str_))
  def client_totals(prefix):
    return _totals(_read_client(prefix))

  @tff.federated_computation(tff.FederatedType(np.str_, tff.CLIENTS))
  def call(prefixes):
    return tff.federated_sum(tff.federated_map(client_totals, prefixes))

  return call


def read_batches() -> tff.Computation:
  """A client's batched dataset from its file prefix, read inside the worker."""
  return tff.tensorflow.computation(_read_client, tff.TensorType(np.str_))


def fed_avg(model: str, element_spec) -> tff.learning.templates.LearningProcess:
  """The FedAvg round of `bench.fedavg_round` (iterator loop) over `model`, 62 labels."""
  return tff.learning.algorithms.build_weighted_fed_avg(
    fedavg_workload.tff_model_fn(element_spec, 0, model, fedavg_workload.FEMNIST_CLASSES),
    client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.1),
    server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0),
    loop_implementation=tff.learning.LoopImplementation.DATASET_ITERATOR,
  )


def round_measures(model: str, datasets, prefixes) -> dict:
  """Timed rounds: FedAvg fed from Python, FedAvg reading files, the plain-TF loop; checks
  first that the two FedAvg sides give the same weights after a round."""
  sent = fed_avg(model, datasets[0].element_spec)
  read = tff.simulation.compose_dataset_computation_with_learning_process(
    read_batches(), fed_avg(model, datasets[0].element_spec)
  )
  states = {'python': sent.next(sent.initialize(), datasets).state}
  states['files'] = read.next(read.initialize(), prefixes).state
  for a, b in zip(
    sent.get_model_weights(states['python']).trainable,
    read.get_model_weights(states['files']).trainable,
  ):
    if not np.array_equal(a, b):
      raise SystemExit('The two FedAvg sides trained different weights.')
  plain = fedavg_workload.PlainFedAvg(
    fedavg_workload.MODELS[model](fedavg_workload.FEMNIST_CLASSES, 0),
    client_learning_rate=0.1,
    server_learning_rate=1.0,
  )

  def python_round():
    states['python'] = sent.next(states['python'], datasets).state

  def files_round():
    states['files'] = read.next(states['files'], prefixes).state

  return {
    'python': stats.timed(python_round),
    'files': stats.timed(files_round),
    'plain_tf': stats.timed(lambda: plain.run_round(datasets)),
  }


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  if not _LEAF_DIR.value:
    raise app.UsageError('--cdt_leaf_dir is required: a LEAF FEMNIST folder (docs/data.md).')
  arrays = fedavg_workload.leaf_client_arrays(_LEAF_DIR.value, _CLIENTS.value)
  datasets = fedavg_workload.client_datasets(arrays, _BATCH_SIZE)
  python_call = from_python(datasets[0].element_spec)
  with tempfile.TemporaryDirectory(prefix='client_data_transfer_') as folder:
    prefixes = write_client_files(arrays, folder)
    files_call = from_files()
    sent, read = python_call(datasets), files_call(prefixes)
    if dict(sent) != dict(read):
      raise SystemExit(f'The two sides disagree: {dict(sent)} from Python, {dict(read)} read.')
    if _MODEL.value:
      measures = round_measures(_MODEL.value, datasets, prefixes)
    else:
      measures = {
        'python': stats.timed(lambda: python_call(datasets)),
        'files': stats.timed(lambda: files_call(prefixes)),
      }
    seconds = stats.interleave(measures, _PAIRS.value, warmup=1)
  examples = int(sent['examples'])
  ratio = stats.ratio_estimate(seconds['files'], seconds['python'])
  what = f'a FedAvg round of the {_MODEL.value}' if _MODEL.value else 'a call that counts'
  print(
    f'Client data into TFF, {what}: {len(arrays)} writers, {examples} examples '
    f'({sum(a["x"].nbytes for a in arrays) / 1e6:.1f} MB of pixels), {_PAIRS.value} pairs'
  )
  for label, values in seconds.items():
    print(f'{label:<8} median {np.median(values):.3f} s')
  print(f'files / python: {ratio.median:.3g} {ratio.interval} ({ratio.pairs} pairs)')
  if _MODEL.value:
    for label in ('python', 'files'):
      versus = stats.ratio_estimate(seconds[label], seconds['plain_tf'])
      print(f'{label} / plain_tf: {versus.median:.3g} {versus.interval}')


if __name__ == '__main__':
  app.run(main)
