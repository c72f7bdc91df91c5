#!/usr/bin/env python3
"""Writes the small deterministic checkpoint fixtures of the format tests.

Usage: make-format-fixtures.py [OUT_DIR]   (default: tests/data/formats)

Needs torch (1.13 or later) and numpy. For each fixture FILE it also writes
FILE.json: {"format": ..., "tensors": [{"name", "dtype", "shape"}, ...]} as
torch, numpy or our own safetensors writer report them, which the C++ tests
compare with DetectLayout. Conventions shared with codec/format:
  - torch: a storage is listed once, named by the dict-key path of the first
    tensor (in pickle order) that views it; its shape is that tensor's shape
    when the tensor covers the whole storage contiguously from offset 0, else
    [numel]. Empty storages are not listed. A root tensor is named "tensor".
  - npy: one tensor named "array"; the shape is in memory order (reversed
    for Fortran-order arrays).
  - safetensors: the JSON keys; empty tensors are not listed.
"""
import argparse
import collections
import io
import json
import os
import struct
import sys
import zipfile

import numpy as np
import torch

DTYPE_NAMES = {
    torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.float64: "f64",
    torch.uint8: "u8", torch.int8: "i8", torch.int16: "i16", torch.int32: "i32", torch.int64: "i64",
    torch.bool: "bool", torch.complex64: "c64", torch.complex128: "c128",
}
NUMPY_NAMES = {
    "float16": "f16", "float32": "f32", "float64": "f64", "uint8": "u8", "int8": "i8", "int16": "i16",
    "int32": "i32", "int64": "i64", "uint16": "u16", "uint32": "u32", "uint64": "u64", "bool": "bool",
    "complex64": "c64", "complex128": "c128",
}


def write_expected(path, fmt, tensors):
    with open(path + ".json", "w") as f:
        json.dump({"format": fmt, "tensors": tensors}, f, indent=1, sort_keys=True)
        f.write("\n")


def torch_expected(obj):
    out, seen = [], set()

    def walk(value, path):
        if isinstance(value, torch.Tensor):
            storage = value.storage()
            if storage.size() == 0 or storage.data_ptr() in seen:
                return
            seen.add(storage.data_ptr())
            whole = value.storage_offset() == 0 and value.numel() == storage.size() and value.is_contiguous()
            shape = list(value.shape) if whole else [storage.size()]
            out.append({"name": path or "tensor", "dtype": DTYPE_NAMES[value.dtype], "shape": shape})
        elif isinstance(value, dict):
            for k, v in value.items():
                walk(v, f"{path}.{k}" if path else str(k))
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                walk(v, f"{path}.{i}" if path else str(i))
        elif hasattr(value, "__dict__") and not isinstance(value, type):
            walk(vars(value), path)  # objects: attributes, as pickled state

    walk(obj, "")
    return out


def save_torch(out, name, obj, to_bytesio=False, protocol=2):
    path = os.path.join(out, name)
    if to_bytesio:
        buf = io.BytesIO()
        torch.save(obj, buf, pickle_protocol=protocol)
        with open(path, "wb") as f:
            f.write(buf.getvalue())
    else:
        torch.save(obj, path, pickle_protocol=protocol)
    write_expected(path, "torch-zip", torch_expected(torch.load(path)))
    return path


def repack_zip64(src, dst):
    """Re-zips a torch file with Python's zipfile: no data descriptors, no
    alignment, zip64 extra fields in the local headers."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            target = zipfile.ZipInfo(info.filename, date_time=(2020, 1, 1, 0, 0, 0))
            with zout.open(target, "w", force_zip64=True) as f:
                f.write(zin.read(info))
    with open(src + ".json") as f:
        expected = json.load(f)
    with open(dst + ".json", "w") as f:
        json.dump(expected, f, indent=1, sort_keys=True)
        f.write("\n")


def make_torch(out):
    g = torch.Generator().manual_seed(1234)
    randn = lambda *s: torch.randn(*s, generator=g)
    save_torch(out, "torch_dtypes.pt", {
        "f32": randn(3, 4), "bf16": randn(5).bfloat16(), "f16": randn(2, 2).half(), "f64": randn(3).double(),
        "i64": torch.arange(6).view(2, 3), "i32": torch.arange(4, dtype=torch.int32),
        "i16": torch.arange(3, dtype=torch.int16), "i8": torch.arange(-2, 2, dtype=torch.int8),
        "u8": torch.arange(5, dtype=torch.uint8), "bool": torch.tensor([True, False, True]),
        "c64": torch.complex(randn(2), randn(2)), "scalar": torch.tensor(2.5), "empty": torch.zeros(0),
    })
    base = torch.arange(12.0)
    part_first = torch.arange(8.0)
    save_torch(out, "torch_views.pt", {
        "a": base.view(3, 4), "slice": base[2:5], "t": base.view(3, 4).t(),
        "part": part_first[:4], "whole": part_first,
        "transposed_first": torch.arange(6.0).view(2, 3).t(),
    })
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
    save_torch(out, "torch_optim.pt", {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 3})
    save_torch(out, "torch_bytesio.pt", {"w": randn(2, 3), "b": randn(3).half()}, to_bytesio=True)
    save_torch(out, "torch_nested.pt", {
        "layers": [randn(2), {"w": randn(2, 2).bfloat16()}], "pair": (randn(1), torch.arange(3)), 5: randn(3),
        "param": torch.nn.Parameter(randn(2, 2)), "meta": {"name": "x", "lr": 0.1, "none": None},
    })
    save_torch(out, "torch_root.pt", randn(4, 2))
    # Non-tensor values a training script puts next to its tensors: objects
    # (NEWOBJ/BUILD), sets, big and negative ints, bytes, odd keys.
    save_torch(out, "torch_objects.pt", {
        "args": argparse.Namespace(lr=0.1, mask=torch.ones(3, dtype=torch.bool)), "tags": {"a", "b"},
        "big": 2**70, "neg": -5, "nan": float("nan"), "raw": b"\x00\x01", (1, 2): "tuple key", None: 0,
        "sched": collections.OrderedDict([("w", randn(2).double()), ("n", 3)]), "cplx": complex(1, 2),
    })
    # Protocol 4 exercises FRAME, MEMOIZE, SHORT_BINUNICODE and STACK_GLOBAL.
    save_torch(out, "torch_proto4.pt", {"enc": {"w": randn(3, 2), "ids": torch.arange(4)}, "lst": [randn(2).half()]},
               protocol=4)
    save_torch(out, "torch_large.pt", {"big": randn(128, 128), "small": randn(7).half()})
    repack_zip64(os.path.join(out, "torch_dtypes.pt"), os.path.join(out, "torch_repacked_zip64.pt"))


SAFETENSORS_DTYPES = {
    "F64": (8, "f64"), "F32": (4, "f32"), "F16": (2, "f16"), "BF16": (2, "bf16"), "I64": (8, "i64"),
    "I32": (4, "i32"), "I16": (2, "i16"), "I8": (1, "i8"), "U8": (1, "u8"), "U16": (2, "u16"),
    "U32": (4, "u32"), "U64": (8, "u64"), "BOOL": (1, "bool"), "F8_E4M3": (1, "f8e4m3"),
    "F8_E5M2": (1, "f8e5m2"), "C64": (8, "c64"),
}


def write_safetensors(path, tensors, metadata=None):
    """tensors: list of (name, dtype, shape). Data bytes are deterministic."""
    header, chunks, offset, expected = {}, [], 0, []
    rng = np.random.default_rng(7)
    for name, dtype, shape in tensors:
        size = SAFETENSORS_DTYPES[dtype][0] * int(np.prod(shape, dtype=np.int64))
        data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        if dtype == "BOOL":
            data = bytes(b & 1 for b in data)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        chunks.append(data)
        offset += size
        if size > 0:
            expected.append({"name": name, "dtype": SAFETENSORS_DTYPES[dtype][1], "shape": shape})
    if metadata is not None:
        header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(chunks))
    write_expected(path, "safetensors", expected)


def make_safetensors(out):
    write_safetensors(os.path.join(out, "all_dtypes.safetensors"),
                      [(f"t.{d.lower()}", d, [2, 3]) for d in SAFETENSORS_DTYPES] +
                      [("scalar", "F32", []), ("empty", "F16", [0, 4])],
                      metadata={"format": "pt"})
    write_safetensors(os.path.join(out, "model.safetensors"),
                      [("model.embed.weight", "BF16", [16, 8]), ("model.norm.weight", "F32", [8]),
                       ("model.head.weight", "F16", [4, 8])])


def save_npy(out, name, array, version=None, fortran=False):
    path = os.path.join(out, name)
    with open(path, "wb") as f:
        np.lib.format.write_array(f, array, version=version)
    shape = list(array.shape)
    if fortran:
        shape.reverse()
    tensors = [] if array.size == 0 else [{"name": "array", "dtype": NUMPY_NAMES[array.dtype.name], "shape": shape}]
    write_expected(path, "npy", tensors)


def write_npz(path, arrays, compression):
    """What np.savez / np.savez_compressed write, with a fixed timestamp so
    that the fixture is reproducible."""
    with zipfile.ZipFile(path, "w", compression, allowZip64=True) as z:
        for name, array in arrays.items():
            info = zipfile.ZipInfo(name + ".npy", date_time=(2020, 1, 1, 0, 0, 0))
            info.compress_type = compression
            with z.open(info, "w", force_zip64=True) as f:
                np.lib.format.write_array(f, array)
    with np.load(path) as loaded:  # numpy must read it back as written
        assert sorted(loaded.files) == sorted(arrays)


def make_npy(out):
    rng = np.random.default_rng(3)
    save_npy(out, "v1_f32.npy", rng.standard_normal((2, 3)).astype("<f4"))
    save_npy(out, "v2_f16.npy", rng.standard_normal(5).astype("<f2"), version=(2, 0))
    save_npy(out, "v3_i64.npy", np.arange(6, dtype="<i8").reshape(3, 2), version=(3, 0))
    save_npy(out, "fortran_f64.npy", np.asfortranarray(rng.standard_normal((3, 2))), fortran=True)
    save_npy(out, "big_endian_f4.npy", rng.standard_normal(4).astype(">f4"))
    save_npy(out, "bool.npy", np.array([True, False, True, True]))
    save_npy(out, "u8.npy", np.arange(7, dtype=np.uint8))
    save_npy(out, "scalar_0d.npy", np.array(1.5, dtype="<f8"))
    # npz: stored members; keys are the member names without ".npy".
    npz = os.path.join(out, "arrays.npz")
    arrays = {"weights": rng.standard_normal((4, 3)).astype("<f4"), "ids": np.arange(5, dtype="<i8")}
    write_npz(npz, arrays, zipfile.ZIP_STORED)
    write_expected(npz, "npz", [{"name": k, "dtype": NUMPY_NAMES[v.dtype.name], "shape": list(v.shape)}
                                for k, v in arrays.items()])
    write_npz(os.path.join(out, "compressed.npz"), {"a": np.zeros(16, dtype="<f4")}, zipfile.ZIP_DEFLATED)
    # Formats we must refuse (opaque): object and structured dtypes.
    with open(os.path.join(out, "object.npy"), "wb") as f:
        np.save(f, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    with open(os.path.join(out, "structured.npy"), "wb") as f:
        np.save(f, np.zeros(3, dtype=[("x", "<f4"), ("y", "<i4")]))


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "tests", "data", "formats")
    os.makedirs(out, exist_ok=True)
    make_torch(out)
    make_safetensors(out)
    make_npy(out)


if __name__ == "__main__":
    main()
