#!/usr/bin/env python3
"""Writes the fuzzers' seed inputs (small, valid examples of each format) into this folder:
   python3 tests/fuzz/seeds/make_seeds.py"""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def put(folder, name, data):
    os.makedirs(os.path.join(HERE, folder), exist_ok=True)
    with open(os.path.join(HERE, folder, name), "wb") as f:
        f.write(data)


def safetensors(tensors, meta=None):
    header, blob = {}, b""
    if meta:
        header["__metadata__"] = meta
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(blob), len(blob) + len(data)]}
        blob += data
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + blob


put("safetensors", "bool", safetensors({"mask": ("BOOL", [4], bytes([1, 0, 1, 1]))}, {"step": "3"}))
put("safetensors", "mixed", safetensors({
    "w": ("F32", [2, 2], struct.pack("<4f", 1, -2, 0.5, 8)),
    "ids": ("I64", [3], struct.pack("<3q", 5, -6, 7)),
    "h": ("BF16", [1], bytes([0x49, 0x40])),
}))


def idx(dims, data):
    return struct.pack(">I", 0x800 + len(dims)) + b"".join(struct.pack(">I", d) for d in dims) + bytes(data)


images = idx([2, 2, 2], range(8))
labels = idx([2], [3, 9])
rest = len(images) + len(labels)
split = next(b for b in range(256) if rest * b // 255 == len(images))
put("idx", "two", bytes([split]) + images + labels)

put("devices", "one", json.dumps({"name": "t4x", "fp32_tflops": 8.1, "mem_gb": 16, "mem_bw_gbs": 320,
                                   "layout_tile": [8, 8], "dtypes": ["float32", "float16"]}).encode())
put("devices", "array", json.dumps([{"name": "a", "cls": "tpu", "fp32_tflops": 1, "mem_gb": 1, "mem_bw_gbs": 1,
                                     "replicas": 8, "alignment": 128}]).encode())

# IR programs (see fuzz_ir.cpp for how bytes are read): a few ops over small shapes.
put("ir", "add", bytes([1, 2, 3, 4, 5, 1, 0, 1, 0, 0, 0, 0, 0, 0]))
put("ir", "matmul", bytes([2, 2, 3, 4, 5, 2, 4, 2, 5, 30, 0, 1, 0, 0, 0, 0, 0, 24, 0, 1, 0, 0, 0, 0, 0]))
put("ir", "reduce", bytes([1, 3, 2, 3, 4, 5, 22, 0, 1, 5, 0, 0, 0, 0, 0]))

# ONNX models, protobuf wire format written out by hand (field numbers from onnx/onnx.proto):
# an MLP with raw-data initializers, one with an external-data initializer, one with a Constant
# feeding Reshape. The importer's fuzzer (fuzz_onnx.cpp) mutates them.


def varint(v):
    out = b""
    while True:
        b, v = v & 0x7F, v >> 7
        out += bytes([b | (0x80 if v else 0)])
        if not v:
            return out


def field(num, value):
    if isinstance(value, int):
        return varint(num << 3) + varint(value)
    if isinstance(value, str):
        value = value.encode()
    return varint(num << 3 | 2) + varint(len(value)) + value


def tensor(name, dims, floats=None, external=None):
    t = b"".join(field(1, d) for d in dims) + field(2, 1) + field(8, name)  # dims, FLOAT, name
    if floats is not None:
        t += field(9, struct.pack("<%df" % len(floats), *floats))
    if external:
        t += b"".join(field(13, field(1, k) + field(2, v)) for k, v in external) + field(14, 1)
    return t


def value_info(name, dims):
    shape = b"".join(field(1, field(1, d)) for d in dims)
    return field(1, name) + field(2, field(1, field(1, 1) + field(2, shape)))


def node(op, inputs, outputs, attrs=b""):
    return b"".join(field(1, i) for i in inputs) + b"".join(field(2, o) for o in outputs) + field(4, op) + attrs


def model(nodes, inits, inputs, outputs):
    g = b"".join(field(1, n) for n in nodes) + field(2, "g") + b"".join(field(5, t) for t in inits)
    g += b"".join(field(11, value_info(*i)) for i in inputs) + b"".join(field(12, value_info(o, [])) for o in outputs)
    return field(1, 8) + field(8, field(1, "") + field(2, 13)) + field(7, g)


put("onnx", "mlp", model(
    [node("MatMul", ["x", "w"], ["h"]), node("Add", ["h", "b"], ["a"]), node("Relu", ["a"], ["y"])],
    [tensor("w", [3, 2], [0.5, -1, 2, 0.25, 1, -0.5]), tensor("b", [2], [0.1, -0.1])],
    [("x", [4, 3])], ["y"]))
put("onnx", "external", model(
    [node("Mul", ["x", "w"], ["y"])],
    [tensor("w", [4], external=[("location", "weights.bin"), ("offset", "0"), ("length", "16")])],
    [("x", [4])], ["y"]))
shape_attr = field(5, field(1, "value") + field(20, 4) + field(5, b"".join(field(1, d) for d in [1]) + field(2, 7) +
                                                               field(9, struct.pack("<q", -1))))
put("onnx", "reshape", model(
    [node("Constant", [], ["s"], shape_attr), node("Reshape", ["x", "s"], ["y"])], [], [("x", [2, 3])], ["y"]))


# .npy (format 1.0 and 2.0): a header dictionary padded so the data starts 64-byte aligned.
def npy(descr, shape, data, version=1):
    dims = ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "")
    header = "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }" % (descr, dims)
    lead = 10 if version == 1 else 12
    header += " " * ((64 - (lead + len(header) + 1) % 64) % 64) + "\n"
    size = struct.pack("<H", len(header)) if version == 1 else struct.pack("<I", len(header))
    return b"\x93NUMPY" + bytes([version, 0]) + size + header.encode("latin1") + data


put("npy", "f4", npy("<f4", [2, 3], struct.pack("<6f", 1, -2, 3.5, 0, 1e-3, -7)))
put("npy", "i8", npy("<i8", [4], struct.pack("<4q", 1, -2, 3, 1 << 40)))
put("npy", "b1", npy("|b1", [3], bytes([1, 0, 1])))
put("npy", "scalar_v2", npy("<f8", [], struct.pack("<d", 2.5), version=2))
