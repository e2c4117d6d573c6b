"""tessera.utils.data: torch.utils.data's Dataset, TensorDataset, Subset, random_split and
DataLoader (batching, shuffling with tessera's generator, drop_last, the default collate).
Loading runs in the calling process: num_workers and pin_memory are accepted and change nothing
but speed, since batches are host data copied into tensors either way."""
import bisect
import itertools
import math
import numbers
import sys

import tessera


class Dataset:
    def __getitem__(self, index):
        raise NotImplementedError

    def __add__(self, other):
        return ConcatDataset([self, other])


class TensorDataset(Dataset):
    def __init__(self, *tensors):
        if any(t.shape[0] != tensors[0].shape[0] for t in tensors):
            raise ValueError("Size mismatch between tensors")
        self.tensors = tensors

    def __getitem__(self, index):
        return tuple(t[index] for t in self.tensors)

    def __len__(self):
        return self.tensors[0].shape[0]


class ConcatDataset(Dataset):
    def __init__(self, datasets):
        self.datasets = list(datasets)
        self.cumulative_sizes = list(itertools.accumulate(len(d) for d in self.datasets))

    def __len__(self):
        return self.cumulative_sizes[-1] if self.cumulative_sizes else 0

    def __getitem__(self, index):
        if index < 0:
            index += len(self)
        d = bisect.bisect_right(self.cumulative_sizes, index)
        return self.datasets[d][index - (self.cumulative_sizes[d - 1] if d else 0)]


class Subset(Dataset):
    def __init__(self, dataset, indices):
        self.dataset, self.indices = dataset, list(indices)

    def __getitem__(self, index):
        return self.dataset[self.indices[index]]

    def __len__(self):
        return len(self.indices)


def random_split(dataset, lengths, generator=None):
    if generator is not None:
        raise TypeError("tessera.utils.data.random_split: generator= is not supported")
    n = len(dataset)
    if all(isinstance(x, float) for x in lengths) and abs(sum(lengths) - 1) < 1e-9:
        sizes = [math.floor(n * f) for f in lengths]
        for i in range(n - sum(sizes)):
            sizes[i % len(sizes)] += 1
        lengths = sizes
    if sum(lengths) != n:
        raise ValueError("Sum of input lengths does not equal the length of the input dataset!")
    order = tessera.randperm(n).tolist()
    out, start = [], 0
    for k in lengths:
        out.append(Subset(dataset, order[start:start + k]))
        start += k
    return out


def default_collate(batch):
    """Stacks a list of samples the way torch's default_collate does: tensors, numpy arrays and
    numbers become one tensor with a leading batch dim; tuples, lists and dicts are collated
    field by field; strings stay lists."""
    first = batch[0]
    np = sys.modules.get("numpy")  # numpy is optional: only arrays that exist need it
    if isinstance(first, tessera.Tensor):
        return tessera.stack(list(batch), 0)
    if np is not None and isinstance(first, np.ndarray):
        return tessera.tensor(np.stack(batch))
    if isinstance(first, bool):
        return tessera.tensor(batch, dtype=tessera.bool)
    if isinstance(first, numbers.Integral):
        return tessera.tensor(batch, dtype=tessera.int64)
    if isinstance(first, numbers.Real):
        return tessera.tensor(batch, dtype=tessera.float64)
    if isinstance(first, (str, bytes)):
        return list(batch)
    if isinstance(first, dict):
        return {k: default_collate([b[k] for b in batch]) for k in first}
    if isinstance(first, (tuple, list)):
        fields = [default_collate(list(f)) for f in zip(*batch)]
        return type(first)(*fields) if hasattr(first, "_fields") else (fields if isinstance(first, list) else
                                                                        tuple(fields))
    raise TypeError(f"default_collate: batch elements of type {type(first).__name__} are not supported")


class DataLoader:
    def __init__(self, dataset, batch_size=1, shuffle=False, sampler=None, batch_sampler=None, num_workers=0,
                 collate_fn=None, pin_memory=False, drop_last=False, timeout=0, worker_init_fn=None,
                 generator=None, *, prefetch_factor=None, persistent_workers=False, pin_memory_device=""):
        if batch_sampler is not None or generator is not None:
            raise TypeError("tessera.utils.data.DataLoader: batch_sampler= and generator= are not supported")
        if sampler is not None and shuffle:
            raise ValueError("sampler option is mutually exclusive with shuffle")
        self.dataset, self.batch_size, self.shuffle, self.sampler = dataset, batch_size, shuffle, sampler
        self.drop_last, self.num_workers, self.pin_memory = drop_last, num_workers, pin_memory
        self.collate_fn = collate_fn or default_collate

    def _indices(self):
        if self.sampler is not None:
            return list(self.sampler)
        n = len(self.dataset)
        return tessera.randperm(n).tolist() if self.shuffle else list(range(n))

    def __iter__(self):
        idx = self._indices()
        if self.batch_size is None:
            for i in idx:
                yield self.collate_fn(self.dataset[i]) if self.collate_fn is not default_collate else self.dataset[i]
            return
        for start in range(0, len(idx), self.batch_size):
            chunk = idx[start:start + self.batch_size]
            if len(chunk) < self.batch_size and self.drop_last:
                return
            yield self.collate_fn([self.dataset[i] for i in chunk])

    def __len__(self):
        n = len(self.sampler) if self.sampler is not None else len(self.dataset)
        if self.batch_size is None:
            return n
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)


def __getattr__(name):
    raise AttributeError(f"tessera.utils.data.{name} is not supported")
