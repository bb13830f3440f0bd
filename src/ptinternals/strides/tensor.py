"""A strided tensor from first principles: a flat storage plus ``(shape, strides, storage_offset)``.

This is the same split PyTorch makes between ``c10::StorageImpl`` (a flat buffer of bytes) and
``c10::TensorImpl`` (sizes, strides and an offset into that buffer). Every view below returns a new
``StridedTensor`` over the *same* ``Storage`` object; only ``contiguous()`` (when needed) copies.

>>> t = StridedTensor.arange(6).view(2, 3)
>>> t.transpose(0, 1).strides, t.transpose(0, 1).is_contiguous()
((1, 3), False)
>>> t.transpose(0, 1).storage is t.storage      # a view: same storage
True
"""
from __future__ import annotations

from itertools import product
from typing import Iterator, Sequence

from . import meta


class Storage:
    """A flat, 1-D, mutable buffer of Python numbers, shared by every view of it (``StorageImpl``)."""

    def __init__(self, data: Sequence):
        self.data = list(data)

    def __len__(self) -> int:
        return len(self.data)

    def __repr__(self) -> str:
        return f"Storage({self.data})"


class StridedTensor:
    """An n-d view of a :class:`Storage`: element ``i`` lives at ``offset + sum(i_k * strides_k)``."""

    def __init__(self, storage: Storage, shape: Sequence[int], strides: Sequence[int] | None = None, offset: int = 0):
        if not isinstance(storage, Storage):
            raise TypeError(f"storage must be a Storage, got {type(storage).__name__}")
        self.storage = storage
        self.shape = meta.check_shape(shape)
        self.strides = meta.contiguous_strides(self.shape) if strides is None else meta.check_strides(strides, self.shape)
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ValueError(f"storage offset must be an int >= 0, got {offset!r}")
        self.offset = offset
        needed = meta.storage_extent(self.shape, self.strides, offset)
        if needed > len(storage):
            raise ValueError(
                f"shape {self.shape}, strides {self.strides} and offset {offset} reach storage element "
                f"{needed - 1}, but the storage has only {len(storage)} elements"
            )

    # ---- construction -------------------------------------------------------------------------
    @classmethod
    def from_list(cls, data: Sequence, shape: Sequence[int] | None = None) -> "StridedTensor":
        data = list(data)
        shape = (len(data),) if shape is None else meta.check_shape(shape)
        if meta.numel(shape) != len(data):
            raise ValueError(f"{len(data)} values cannot fill shape {tuple(shape)} ({meta.numel(shape)} elements)")
        return cls(Storage(data), shape)

    @classmethod
    def arange(cls, n: int) -> "StridedTensor":
        if n < 0:
            raise ValueError(f"arange needs n >= 0, got {n}")
        return cls.from_list(range(n))

    @classmethod
    def from_torch(cls, t) -> "StridedTensor":
        """Mirror a torch tensor's metadata over a copy of its whole storage (to compare with torch)."""
        flat = t.detach().cpu()
        base = flat.new_empty(0).set_(flat.untyped_storage()).reshape(-1)  # every element of the storage
        return cls(Storage(base.tolist()), tuple(t.shape), tuple(t.stride()), t.storage_offset())

    # ---- the metadata ---------------------------------------------------------------------------
    @property
    def ndim(self) -> int:
        return len(self.shape)

    def numel(self) -> int:
        return meta.numel(self.shape)

    def storage_index(self, index: Sequence[int]) -> int:
        return meta.storage_index(index, self.shape, self.strides, self.offset)

    def is_contiguous(self) -> bool:
        return meta.is_contiguous(self.shape, self.strides)

    def touched(self) -> list[int]:
        """Storage positions this view reads, in logical (row-major) order; repeats show stride 0."""
        return [self.storage_index(i) for i in self._indices()]

    def _indices(self) -> Iterator[tuple[int, ...]]:
        return product(*(range(s) for s in self.shape))

    # ---- element access ----------------------------------------------------------------------------
    def __getitem__(self, index):
        index = index if isinstance(index, tuple) else (index,)
        if len(index) == self.ndim and all(isinstance(i, int) for i in index):
            return self.storage.data[self.storage_index(index)]
        view = self
        dim = 0
        for i in index:  # basic indexing: ints select, slices slice
            if isinstance(i, int):
                view = view.select(dim, i)
            elif isinstance(i, slice):
                view = view.slice(dim, i.start, i.stop, 1 if i.step is None else i.step)
                dim += 1
            else:
                raise TypeError(f"only ints and slices index a StridedTensor, got {type(i).__name__}")
        return view

    def __setitem__(self, index, value) -> None:
        index = index if isinstance(index, tuple) else (index,)
        self.storage.data[self.storage_index(index)] = value

    def tolist(self):
        def build(prefix: tuple[int, ...]):
            if len(prefix) == self.ndim:
                return self.storage.data[self.storage_index(prefix)]
            return [build(prefix + (i,)) for i in range(self.shape[len(prefix)])]

        return build(())

    # ---- views: new metadata, same storage --------------------------------------------------------
    def _view(self, shape, strides, offset=None) -> "StridedTensor":
        return StridedTensor(self.storage, shape, strides, self.offset if offset is None else offset)

    def view(self, *shape) -> "StridedTensor":
        shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        strides = meta.view_strides(self.shape, self.strides, shape)
        if strides is None:
            raise RuntimeError(meta.explain_view_failure(self.shape, self.strides, shape))
        return self._view(meta.infer_size(shape, self.numel()), strides)

    def reshape(self, *shape) -> "StridedTensor":
        """A view when one exists, otherwise a copy: why ``reshape`` sometimes costs memory."""
        shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        strides = meta.view_strides(self.shape, self.strides, shape)
        if strides is not None:
            return self._view(meta.infer_size(shape, self.numel()), strides)
        return self.contiguous().view(*shape)

    def permute(self, *dims) -> "StridedTensor":
        dims = tuple(dims[0]) if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else dims
        return self._view(*meta.permute_meta(self.shape, self.strides, dims))

    def transpose(self, dim0: int, dim1: int) -> "StridedTensor":
        return self._view(*meta.transpose_meta(self.shape, self.strides, dim0, dim1))

    @property
    def T(self) -> "StridedTensor":
        return self.permute(tuple(range(self.ndim - 1, -1, -1)))

    def expand(self, *shape) -> "StridedTensor":
        shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        return self._view(*meta.expand_meta(self.shape, self.strides, shape))

    def slice(self, dim: int, start: int | None = None, stop: int | None = None, step: int = 1) -> "StridedTensor":
        return self._view(*meta.slice_meta(self.shape, self.strides, self.offset, dim, start, stop, step))

    def narrow(self, dim: int, start: int, length: int) -> "StridedTensor":
        return self._view(*meta.narrow_meta(self.shape, self.strides, self.offset, dim, start, length))

    def select(self, dim: int, index: int) -> "StridedTensor":
        return self._view(*meta.select_meta(self.shape, self.strides, self.offset, dim, index))

    def unfold(self, dim: int, size: int, step: int) -> "StridedTensor":
        return self._view(*meta.unfold_meta(self.shape, self.strides, dim, size, step))

    def as_strided(self, shape: Sequence[int], strides: Sequence[int], offset: int | None = None) -> "StridedTensor":
        """Any metadata at all, checked only against the storage's bounds. Powerful and unsafe."""
        return self._view(shape, strides, offset)

    # ---- the one operation that copies ---------------------------------------------------------------
    def contiguous(self) -> "StridedTensor":
        """``self`` if already contiguous; otherwise a copy into fresh row-major storage."""
        if self.is_contiguous():
            return self
        return StridedTensor.from_list([self.storage.data[p] for p in self.touched()], self.shape)

    def clone(self) -> "StridedTensor":
        return StridedTensor.from_list([self.storage.data[p] for p in self.touched()], self.shape)

    def __repr__(self) -> str:
        return f"StridedTensor(shape={self.shape}, strides={self.strides}, offset={self.offset}, storage={len(self.storage)} elements)"
