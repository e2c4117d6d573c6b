#!/usr/bin/python3
"""A Fashion-MNIST classifier (conv + batch norm + max-pool, twice, then two linear layers)
trained with SGD + Nesterov momentum, written as a PyTorch user writes one. The data are
Debian's dataset-fashion-mnist files (/usr/share/datasets/fashion-mnist).

    /usr/bin/python3 examples/python/cnn.py                      # PyTorch
    build/pyvenv/bin/python examples/python/as_tessera.py examples/python/cnn.py   # on Tessera

--save-init/--load-init write/read the initial weights (.npz); batches come from numpy's
generator, so two runs see the same data. Prints one line per step: "step N loss L".
"""
import argparse
import gzip
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

DATA = "/usr/share/datasets/fashion-mnist"


def read_idx(path):
    with gzip.open(path, "rb") as f:
        raw = f.read()
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


class Net(nn.Module):
    def __init__(self, c1=8, c2=16, hidden=64, classes=10, batch_norm=False):
        super().__init__()
        norm = nn.BatchNorm2d if batch_norm else (lambda c: nn.Identity())
        self.features = nn.Sequential(
            nn.Conv2d(1, c1, kernel_size=3, padding=1),
            norm(c1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(c1, c2, kernel_size=3, padding=1),
            norm(c2),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
        )
        self.fc1 = nn.Linear(c2 * 7 * 7, hidden)
        self.dropout = nn.Dropout(0.0)
        self.fc2 = nn.Linear(hidden, classes)

    def forward(self, x):
        x = self.features(x)
        x = torch.flatten(x, 1)
        x = self.dropout(F.relu(self.fc1(x)))
        return self.fc2(x)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.03)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch-norm", action="store_true", help="BatchNorm2d after each convolution")
    ap.add_argument("--save-init")
    ap.add_argument("--load-init")
    args = ap.parse_args(argv)

    images = read_idx(f"{DATA}/train-images-idx3-ubyte.gz")
    labels = read_idx(f"{DATA}/train-labels-idx1-ubyte.gz").astype(np.int64)
    images = ((images.astype(np.float32) / 255.0 - 0.2860) / 0.3530)[:, None, :, :]

    torch.manual_seed(args.seed)
    model = Net(batch_norm=args.batch_norm)
    if args.load_init:
        init = np.load(args.load_init)
        model.load_state_dict({k: torch.tensor(init[k]) for k in init.files})
    if args.save_init:
        np.savez(args.save_init, **{k: v.detach().cpu().numpy() for k, v in model.state_dict().items()})
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, nesterov=True, weight_decay=5e-4)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.steps)

    rng = np.random.default_rng(args.seed)
    order = rng.permutation(len(images))
    model.train()
    t0 = time.time()
    for step in range(args.steps):
        idx = order[step * args.batch:(step + 1) * args.batch]
        x, y = torch.tensor(images[idx]), torch.tensor(labels[idx])
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        scheduler.step()
        print(f"step {step} loss {loss.item():.6f}", flush=True)
    print(f"time {time.time() - t0:.3f}s", flush=True)

    model.eval()
    with torch.no_grad():
        x, y = torch.tensor(images[-500:]), torch.tensor(labels[-500:])
        correct = (model(x).argmax(dim=1) == y).sum().item()
    print(f"accuracy {correct / 500:.4f}")


if __name__ == "__main__":
    main()
