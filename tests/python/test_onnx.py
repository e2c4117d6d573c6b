"""tessera.onnx.load: a model exported here by PyTorch runs as a tessera.nn.Module whose outputs
match PyTorch's, whose parameters carry PyTorch's names, and which fine-tunes with tessera.optim
to the losses PyTorch's SGD gives from the same weights; a damaged file is one clear error."""
import os

import numpy as np
import pytest

import tessera
from conftest import normalized_error

if not hasattr(tessera._C, "_onnx"):  # built without libonnx-dev / libprotobuf-dev
    if os.environ.get("CI") == "true":
        pytest.fail("CI=true: tessera was built without ONNX import", allow_module_level=True)
    pytest.skip("tessera was built without ONNX import", allow_module_level=True)


def export(th, model, x, path):
    model.eval()
    th.onnx.export(model, x, str(path), input_names=["x"], output_names=["y"], opset_version=14,
                   dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}}, do_constant_folding=False,
                   training=th.onnx.TrainingMode.PRESERVE)


def test_exported_cnn_matches_torch_and_names_its_parameters(th, tmp_path):
    th.manual_seed(0)
    cnn = th.nn.Sequential(th.nn.Conv2d(1, 4, 3, padding=1), th.nn.BatchNorm2d(4), th.nn.ReLU(), th.nn.MaxPool2d(2),
                           th.nn.Flatten(), th.nn.Linear(64, 10))
    cnn[1].running_mean.uniform_(-0.5, 0.5)
    cnn[1].running_var.uniform_(0.5, 2.0)
    export(th, cnn, th.randn(2, 1, 8, 8), tmp_path / "cnn.onnx")
    m = tessera.onnx.load(tmp_path / "cnn.onnx").eval()
    assert isinstance(m, tessera.nn.Module)
    assert m.input_names == ["x"] and m.output_names == ["y"] and m.opset == 14
    params = dict(m.named_parameters())
    assert sorted(params) == sorted(n for n, _ in cnn.named_parameters())
    assert sorted(n for n, _ in m.named_buffers()) == ["1.running_mean", "1.running_var"]
    for name, p in cnn.named_parameters():
        assert params[name].requires_grad
        assert normalized_error(params[name].detach().numpy(), p.detach().numpy()) == 0
    for batch in (1, 5):  # the dynamic batch dimension
        x = th.randn(batch, 1, 8, 8)
        with th.no_grad():
            want = cnn(x).numpy()
        got = m(tessera.tensor(x.numpy())).detach().numpy()
        assert normalized_error(got, want) <= 1e-5


def test_imported_mlp_fine_tunes_like_torch(th, tmp_path):
    th.manual_seed(1)
    mlp = th.nn.Sequential(th.nn.Linear(8, 16), th.nn.ReLU(), th.nn.Linear(16, 4))
    export(th, mlp, th.randn(5, 8), tmp_path / "mlp.onnx")
    m = tessera.onnx.load(str(tmp_path / "mlp.onnx"))
    x, target = th.randn(5, 8), th.randn(5, 4)
    tx, tt = tessera.tensor(x.numpy()), tessera.tensor(target.numpy())
    opt = tessera.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    ref = th.optim.SGD(mlp.parameters(), lr=0.1, momentum=0.9)
    mlp.train()
    for step in range(10):
        opt.zero_grad()
        loss = tessera.nn.functional.mse_loss(m(tx), tt)
        loss.backward()
        opt.step()
        ref.zero_grad()
        want = th.nn.functional.mse_loss(mlp(x), target)
        want.backward()
        ref.step()
        assert abs(loss.item() - want.item()) <= 1e-5 * abs(want.item()), f"step {step}"
    # The updates reached the weights the graph reads, and state_dict shows them.
    got = m.state_dict()["2.weight"].detach().numpy()
    assert normalized_error(got, mlp[2].weight.detach().numpy()) <= 1e-5
    # load_state_dict writes into the same tensors: the model computes with the loaded weights.
    sd = {k: tessera.tensor(v.detach().numpy()) for k, v in mlp.state_dict().items()}
    sd["0.bias"] = tessera.zeros(16)
    m.load_state_dict(sd)
    with th.no_grad():
        mlp[0].bias.zero_()
        want = mlp(x).numpy()
    assert normalized_error(m(tx).detach().numpy(), want) <= 1e-5


def test_damaged_files_are_one_clear_error(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07\x12\x03abc\xff\xff")
    with pytest.raises(tessera.TesseraError) as e:
        tessera.onnx.load(bad)
    assert "not an ONNX model (malformed or truncated protobuf)" in str(e.value)
    assert "\n" not in str(e.value)
    assert "MatMul" in tessera.onnx.supported_ops()
