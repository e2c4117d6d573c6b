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
