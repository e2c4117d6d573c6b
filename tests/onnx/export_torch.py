#!/usr/bin/env python3
"""Exports three PyTorch models to ONNX for tests/onnx/test_onnx_import.cpp (OnnxTorch), with
an input and PyTorch's output for each (.npy), and the losses of 10 SGD steps fine-tuning the
MLP from the exported weights:
  mlp          Linear-ReLU-Linear
  cnn          Conv-BatchNorm(eval, non-trivial running statistics)-ReLU-MaxPool-Flatten-Linear
  transformer  a pre-norm block: causal self-attention (4 heads) and an erf-GELU MLP
usage: export_torch.py OUT_DIR [--dynamic-batch] [--bench-size]   (Debian's python3-torch; exits 3 when torch is missing)
--dynamic-batch: the input's and output's first dimension is the dynamic `batch` (bench/onnx_vs_ort.sh)
--bench-size: also the benchmark-size models (bench/onnx_vs_ort.sh):
  cnn_large          the project's SmallCNN on 28x28 (conv 32 -> ReLU -> pool -> conv 64 -> ReLU ->
                     pool -> linear 128 -> ReLU -> linear 10), with a BatchNorm after each conv
  transformer_large  the block above at GPT width: d 128, 4 heads, 64 positions"""
import math
import sys

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError as e:
    print("missing:", e)
    sys.exit(3)

out = sys.argv[1]
dynamic = {"x": {0: "batch"}, "y": {0: "batch"}} if "--dynamic-batch" in sys.argv[2:] else None
torch.manual_seed(0)


class Block(torch.nn.Module):
    def __init__(self, d=16, heads=4, seq=6):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.fc1, self.fc2 = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)
        self.register_buffer("mask", torch.triu(torch.ones(seq, seq, dtype=torch.bool), diagonal=1))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        heads = lambda z: z.reshape(b, t, self.heads, d // self.heads).transpose(1, 2)
        q, k, v = heads(q), heads(k), heads(v)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        att = att.masked_fill(self.mask[:t, :t], float("-inf")).softmax(-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


def export(name, model, x):
    model.eval()
    with torch.no_grad():
        y = model(x)
    # No constant folding: it would fold the BatchNorm into the convolution before us.
    torch.onnx.export(model, x, f"{out}/{name}.onnx", input_names=["x"], output_names=["y"], opset_version=14,
                      dynamic_axes=dynamic, do_constant_folding=False, training=torch.onnx.TrainingMode.PRESERVE)
    np.save(f"{out}/{name}_x.npy", x.numpy())
    np.save(f"{out}/{name}_y.npy", y.numpy())


mlp = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
export("mlp", mlp, torch.randn(5, 8))
cnn = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                          torch.nn.MaxPool2d(2), torch.nn.Flatten(), torch.nn.Linear(64, 10))
cnn[1].running_mean.uniform_(-0.5, 0.5)
cnn[1].running_var.uniform_(0.5, 2.0)
cnn[1].weight.data.uniform_(0.5, 1.5)
cnn[1].bias.data.uniform_(-0.5, 0.5)
export("cnn", cnn, torch.randn(2, 1, 8, 8))
export("transformer", Block(), torch.randn(2, 6, 16))
if "--bench-size" in sys.argv[2:]:
    cnn_large = torch.nn.Sequential(torch.nn.Conv2d(1, 32, 3, padding=1), torch.nn.BatchNorm2d(32), torch.nn.ReLU(),
                                    torch.nn.MaxPool2d(2), torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.BatchNorm2d(64),
                                    torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Flatten(), torch.nn.Linear(64 * 7 * 7, 128),
                                    torch.nn.ReLU(), torch.nn.Linear(128, 10))
    for bn in (cnn_large[1], cnn_large[5]):
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 2.0)
    export("cnn_large", cnn_large, torch.randn(2, 1, 28, 28))
    export("transformer_large", Block(d=128, heads=4, seq=64), torch.randn(2, 64, 128))

# Fine-tuning the exported MLP: 10 SGD steps (lr 0.1) on the mean squared error to a target.
x, target = torch.from_numpy(np.load(f"{out}/mlp_x.npy")), torch.randn(5, 4)
np.save(f"{out}/mlp_target.npy", target.numpy())
opt = torch.optim.SGD(mlp.parameters(), lr=0.1)
losses = []
mlp.train()
for _ in range(10):
    opt.zero_grad()
    loss = F.mse_loss(mlp(x), target)
    loss.backward()
    opt.step()
    losses.append(loss.item())
np.save(f"{out}/mlp_losses.npy", np.array(losses))
print("exported")
