#!/usr/bin/python3
"""Training-step time of the Fashion-MNIST classifiers in PyTorch on the CPU: the peer of
bench/cnn_step.cpp. The same models as Tessera's nn::SmallCNN (conv 3x3 pad 1 32 -> ReLU ->
max-pool 2 -> conv 3x3 pad 1 64 -> ReLU -> max-pool 2 -> linear 128 -> ReLU -> linear 10) and
nn::ResNet (3x3 stem 16 + BN + ReLU, one basic block per stage of width 16/32/64, stride 2 from
the second stage with a 1x1 conv + BN shortcut, global average pool, linear), Adam (lr 1e-3),
the same first 4 x batch training images (normalized with mean 0.2860, std 0.3530).

    /usr/bin/python3 bench/cnn_step_torch.py THREADS [--model small|resnet] [--batch N] [--steps N] [--warmup N] [--profile]

--profile: the timed steps under torch.profiler, its table of ops by self CPU time (per timed
step: divide by --steps), to set against bench_cnn_step's BENCH_PROFILE=steps.

The last line is machine-readable: RESULT torch threads=... median_ms=... maxrss_mb=...
"""
import argparse
import gzip
import resource
import statistics
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

DATA = "/usr/share/datasets/fashion-mnist"


def images(n):
    with gzip.open(DATA + "/train-images-idx3-ubyte.gz") as f:
        x = np.frombuffer(f.read(), dtype=np.uint8, offset=16)[: n * 784]
    with gzip.open(DATA + "/train-labels-idx1-ubyte.gz") as f:
        y = np.frombuffer(f.read(), dtype=np.uint8, offset=8)[:n]
    x = (x.astype(np.float32) / 255.0 - 0.2860) / 0.3530
    return torch.from_numpy(x.reshape(n, 1, 28, 28).copy()), torch.from_numpy(y.astype(np.int64))


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.fc1 = nn.Linear(64 * 7 * 7, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        h = self.bn2(self.conv2(h))
        return F.relu(h + (self.down(x) if self.down is not None else x))


class ResNet(nn.Module):
    def __init__(self, widths=(16, 32, 64)):
        super().__init__()
        self.stem = nn.Conv2d(1, widths[0], 3, padding=1, bias=False)
        self.stem_bn = nn.BatchNorm2d(widths[0])
        blocks, cin = [], widths[0]
        for s, w in enumerate(widths):
            blocks.append(BasicBlock(cin, w, 2 if s > 0 else 1))
            cin = w
        self.stages = nn.Sequential(*blocks)
        self.head = nn.Linear(cin, 10)

    def forward(self, x):
        h = self.stages(F.relu(self.stem_bn(self.stem(x))))
        return self.head(F.adaptive_avg_pool2d(h, 1).flatten(1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("threads", type=int)
    ap.add_argument("--model", default="small", choices=["small", "resnet"])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    x, y = images(4 * a.batch)
    batches = [(x[i * a.batch:(i + 1) * a.batch], y[i * a.batch:(i + 1) * a.batch]) for i in range(4)]
    model = SmallCNN() if a.model == "small" else ResNet()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    ms, loss, prof = [], None, None
    for step in range(a.warmup + a.steps):
        if step == a.warmup and a.profile:
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True)
            prof.__enter__()
        t0 = time.perf_counter()
        bx, by = batches[step % 4]
        loss = F.cross_entropy(model(bx), by)
        opt.zero_grad()
        loss.backward()
        opt.step()
        last = loss.item()
        if step >= a.warmup:
            ms.append((time.perf_counter() - t0) * 1000)
    if prof is not None:
        prof.__exit__(None, None, None)
        print(prof.key_averages(group_by_input_shape=True).table(sort_by="self_cpu_time_total", row_limit=60))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    med = statistics.median(ms)
    print("torch %s step, batch %d, Adam, %d threads (torch %s): median %.2f ms (min %.2f); max RSS %.1f MiB"
          % (a.model, a.batch, a.threads, torch.__version__, med, min(ms), rss))
    print("RESULT torch threads=%d median_ms=%.3f maxrss_mb=%.1f last_loss=%.4f" % (a.threads, med, rss, last))


if __name__ == "__main__":
    main()
