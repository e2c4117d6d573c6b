"""Errors are Python exceptions of PyTorch's types with tessera's message (op, shapes, module
path); what Tessera lacks fails loudly."""
import pytest

import tessera


def test_shape_mismatch_is_runtime_error_naming_op_and_shapes():
    with pytest.raises(RuntimeError, match=r"\[matmul\].*\[2, 3\].*\[4, 5\]"):
        tessera.ones(2, 3) @ tessera.ones(4, 5)
    with pytest.raises(RuntimeError, match=r"\[add\]"):
        tessera.ones(2, 3) + tessera.ones(4)


def test_error_names_the_module_scope():
    with tessera.scope("blocks"), tessera.scope("0"):
        assert tessera.current_scope() == "blocks.0"
        with pytest.raises(RuntimeError, match="blocks.0"):
            tessera.ones(2, 3) @ tessera.ones(2, 3)
    assert tessera.current_scope() == ""


def test_index_and_dim_errors_are_index_errors():
    x = tessera.ones(2, 3)
    with pytest.raises(IndexError):
        x[5]
    with pytest.raises(IndexError):
        x.sum(dim=4)
    with pytest.raises(IndexError):
        x.softmax(-3)
    with pytest.raises(IndexError):
        x[1, 2, 3]
    assert issubclass(tessera.TesseraIndexError, IndexError)
    assert issubclass(tessera.TesseraError, RuntimeError)


def test_bad_arguments_are_type_errors():
    x = tessera.ones(2)
    with pytest.raises(TypeError):
        x + "a"
    with pytest.raises(TypeError, match="unexpected keyword"):
        tessera.zeros(2, colour="red")
    with pytest.raises(TypeError):
        x.backward(create_graph=True)
    with pytest.raises(TypeError):
        tessera.zeros(2, dtype="float32")
    with pytest.raises(ValueError):
        tessera.ones(2, 2).item()
    with pytest.raises(ValueError):
        bool(tessera.ones(2))
    with pytest.raises(ValueError):
        x[::-1]


def test_unsupported_names_fail_loudly():
    with pytest.raises(AttributeError, match=r"tessera.Tensor.unfold is not supported"):
        tessera.ones(2).unfold
    with pytest.raises(AttributeError, match=r"tessera.fft is not supported"):
        tessera.fft
    assert not hasattr(tessera.ones(1), "storage")


def test_in_place_on_a_leaf_that_requires_grad():
    p = tessera.ones(3, requires_grad=True)
    with pytest.raises(RuntimeError):
        p.add_(1.0)
    with tessera.no_grad():
        p.add_(1.0)
    assert p.tolist() == [2.0, 2.0, 2.0]


def test_no_crash_on_undefined_or_odd_input():
    with pytest.raises(RuntimeError):
        tessera.Tensor() + 1
    with pytest.raises(RuntimeError):
        tessera.ones(2).reshape(3)
    with pytest.raises(RuntimeError):
        tessera.ones(2).to("nosuchdevice")
