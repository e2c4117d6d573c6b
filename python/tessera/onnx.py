"""tessera.onnx: ONNX models imported as tessera.nn.Modules, through the C++ importer
(tessera/onnx.h; docs/architecture.md, "ONNX import", lists the ops and what is refused).

    model = tessera.onnx.load("mlp.onnx")            # device="cpu" by default
    y = model(x)                                     # inputs in model.input_names order
    opt = tessera.optim.SGD(model.parameters(), lr=0.1)
"""
import tessera
from tessera import _C, nn

__all__ = ["Model", "load", "supported_ops"]


def _importer():
    imp = getattr(_C, "_onnx", None)
    if imp is None or not hasattr(imp, "load"):
        raise RuntimeError("tessera.onnx: this Tessera was built without ONNX import "
                           "(Debian's libonnx-dev and libprotobuf-dev were not found)")
    return imp


class Model(nn.Module):
    """An imported ONNX model. forward(*inputs) runs its graph (inputs in input_names order) and
    returns its output, or a tuple when it has several. Its parameters are the file's
    floating-point initializers under the file's names (a dotted name such as "0.weight" nests as
    in PyTorch): handles on the very tensors the graph reads, so tessera.optim's in-place updates
    and load_state_dict change what it computes. Integer initializers and BatchNormalization's
    running statistics are buffers. The device is chosen at load."""

    def __init__(self, imported):
        super().__init__()
        self.__dict__["_imported"] = imported
        for name, t in imported.named_parameters():
            owner, leaf = self._owner(name)
            p = nn.Parameter.__new__(nn.Parameter)
            tessera.Tensor.__init__(p, t)  # a new handle on the same tensor: no copy, no detach
            owner.register_parameter(leaf, p)
        for name, t in imported.named_buffers():
            owner, leaf = self._owner(name)
            owner.register_buffer(leaf, t)

    def _owner(self, name):
        """The submodule that holds `name` ("a.b.weight": a -> b) and the name's last part; names
        that do not split into non-empty parts are kept whole with '.' as '_'."""
        parts = name.split(".")
        if len(parts) == 1 or "" in parts:
            return self, name.replace(".", "_")
        owner = self
        for part in parts[:-1]:
            child = owner._modules.get(part)
            if child is None:
                child = nn.Module()
                owner.add_module(part, child)
            owner = child
        return owner, parts[-1]

    @property
    def input_names(self):
        return list(self._imported.input_names)

    @property
    def output_names(self):
        return list(self._imported.output_names)

    @property
    def opset(self):
        return self._imported.opset

    def forward(self, *inputs):
        outs = self._imported.run(list(inputs))
        return outs[0] if len(outs) == 1 else tuple(outs)

    def train(self, mode=True):
        super().train(mode)
        self._imported.train(mode)
        return self


def load(path, device=None):
    """Reads and checks the ONNX model at `path` (a malformed file, an unsupported op or opset is
    one tessera.TesseraError before anything runs) with its initializers on `device`."""
    return Model(_importer().load(str(path), device))


def supported_ops():
    """The default-domain op types the importer maps, sorted."""
    return list(_importer().supported_ops())
