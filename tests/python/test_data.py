"""tessera.utils.data against torch.utils.data 1.13: the same batches in order (shuffle off),
the default collate of tensors, numpy arrays, numbers, tuples and dicts, drop_last and lengths;
shuffling visits every sample once; random_split partitions."""
import numpy as np
import pytest

from nn_ref import close, tessera, torch

TD, SD = torch.utils.data, tessera.utils.data


class Pairs:
    """A map-style dataset of (array, int, dict) samples, usable by both libraries."""

    def __init__(self, n):
        self.x = np.arange(n * 3, dtype=np.float32).reshape(n, 3)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], i % 4, {"w": float(i) / 2}


@pytest.mark.parametrize("kw", [{"batch_size": 4}, {"batch_size": 4, "drop_last": True}, {"batch_size": 3}])
def test_batches_match_torch(kw):
    tl, sl = TD.DataLoader(Pairs(10), **kw), SD.DataLoader(Pairs(10), **kw)
    assert len(sl) == len(tl)
    tb, sb = list(tl), list(sl)
    assert len(sb) == len(tb)
    for (tx, ty, td), (sx, sy, sd) in zip(tb, sb):
        close(sx, tx, tol=0)
        close(sy, ty, tol=0)
        assert sy.dtype == tessera.int64 and sd["w"].dtype == tessera.float64
        close(sd["w"], td["w"], tol=0)


def test_tensor_dataset_shuffle_and_split():
    x = tessera.arange(20).reshape(10, 2)
    y = tessera.arange(10)
    ds = SD.TensorDataset(x, y)
    assert len(ds) == 10 and ds[3][1].item() == 3
    seen = []
    for bx, by in SD.DataLoader(ds, batch_size=3, shuffle=True):
        assert tuple(bx.shape)[1:] == (2,)
        np.testing.assert_array_equal(bx.numpy()[:, 0], by.numpy() * 2)
        seen += by.tolist()
    assert sorted(seen) == list(range(10))
    a, b = SD.random_split(ds, [7, 3])
    assert len(a) == 7 and len(b) == 3
    assert sorted([a[i][1].item() for i in range(7)] + [b[i][1].item() for i in range(3)]) == list(range(10))
    with pytest.raises(ValueError, match="Sum of input lengths"):
        SD.random_split(ds, [5, 6])
