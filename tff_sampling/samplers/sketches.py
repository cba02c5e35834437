"""Count sketches of client updates: a fixed-length, seeded projection that keeps inner
products in expectation (what clustered sampling by similarity compares, server side)."""

from __future__ import annotations

import numpy as np
from scipy import sparse

from tff_sampling import validation

_SKETCH_STREAM = 7919


def count_sketch_hashes(dim: int, sketch_size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
  """The hash ``h`` and signs ``σ`` of the count sketch ``ℝ^dim → ℝ^sketch_size``.

  Args:
    dim: ``D``, the length of the flattened update.
    sketch_size: ``s``, the length of the sketch.
    seed: The sketch's seed; clients and server must share it (and it must stay
      fixed across rounds, so that sketches of different rounds compare).

  Returns:
    ``(buckets int64[D] in [0, s), signs float32[D] in {-1, +1})``.

  Raises:
    ValueError: If `dim` or `sketch_size` is not a positive integer.
  """
  validation.positive_int('dim', dim)
  validation.positive_int('sketch_size', sketch_size)
  rng = np.random.default_rng([int(seed), _SKETCH_STREAM])
  buckets = rng.integers(0, sketch_size, size=dim, dtype=np.int64)
  signs = (2 * rng.integers(0, 2, size=dim) - 1).astype(np.float32)
  return buckets, signs


def count_sketch(vectors: np.ndarray, sketch_size: int, seed: int) -> np.ndarray:
  """Count sketch of each row: ``y_b = Σ_{j: h(j) = b} σ(j) x_j``.

  ``E[⟨Sx, Sy⟩] = ⟨x, y⟩``, so angles and distances between sketches estimate
  those between the vectors (relative error ``~1/√s`` on inner products).

  Args:
    vectors: ``[n, D]`` (or ``[D]``) finite vectors.
    sketch_size: ``s``.
    seed: As `count_sketch_hashes`.

  Returns:
    ``[n, s]`` (or ``[s]``) sketches, in the input's float dtype (float64 for
    integer input).

  Raises:
    ValueError: If the vectors are not finite or the sizes are not positive.
  """
  vectors = np.asarray(vectors)
  squeeze = vectors.ndim == 1
  matrix = np.atleast_2d(vectors)
  if matrix.ndim != 2:
    raise ValueError(f'vectors must be 1-D or 2-D, got shape {vectors.shape}.')
  if not np.all(np.isfinite(matrix)):
    raise ValueError('vectors must be finite.')
  dtype = matrix.dtype if np.issubdtype(matrix.dtype, np.floating) else np.float64
  dim = matrix.shape[1]
  buckets, signs = count_sketch_hashes(dim, sketch_size, seed)
  projection = sparse.csr_matrix(
    (signs.astype(dtype), (buckets, np.arange(dim))), shape=(sketch_size, dim)
  )
  sketches = np.asarray((projection @ matrix.astype(dtype).T).T, dtype=dtype)
  return sketches[0] if squeeze else sketches
