#!/usr/bin/env python3
"""Writes the seed inputs of //checkpoint:metadata_fuzz and //checkpoint:safetensors_fuzz.

Run from the repo root: python3 checkpoint/testdata/make_fuzz_seeds.py .
The files are built by hand to the formats (checkpoint.proto NOTE [Checksum coverage],
safetensors.h NOTE [Safetensors layout]), so this needs no build; metadata_test and
safetensors_test check that the seeds are valid."""
import struct, json, os, sys
root = sys.argv[1]
def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF
assert crc32c(b"123456789") == 0xE3069283
def varint(n):
    if n < 0: n += 1 << 64
    out = b""
    while True:
        b = n & 0x7f; n >>= 7
        if n: out += bytes([b | 0x80])
        else: return out + bytes([b])
def key(field, wt): return varint((field << 3) | wt)
def f_varint(field, n): return key(field, 0) + varint(n)
def f_bytes(field, b):
    if isinstance(b, str): b = b.encode()
    return key(field, 2) + varint(len(b)) + b
def f_fixed32(field, n): return key(field, 5) + struct.pack("<I", n)
def f_packed_int64(field, vals): return f_bytes(field, b"".join(varint(v) for v in vals))
def f_packed_fixed32(field, vals): return f_bytes(field, b"".join(struct.pack("<I", v) for v in vals))

block = 16
def chunk(file, begin, end, off, data):
    crcs = [crc32c(data[i:i+block]) for i in range(0, len(data), block)]
    return (f_bytes(1, file) + f_varint(2, begin) + f_varint(3, end) + f_varint(4, off) +
            f_varint(5, len(data)) + f_packed_fixed32(6, crcs))
def tensor(name, shape, dtype, chunks):
    return f_bytes(1, name) + f_packed_int64(2, shape) + f_bytes(3, dtype) + b"".join(f_bytes(4, c) for c in chunks)
f0, f1 = "rank-00000-of-00002.bin", "rank-00001-of-00002.bin"
w = bytes(range(48))            # float32 [3, 4]: 12 elements, 6 on each rank
b16 = bytes(range(100, 110))    # bfloat16 [5]
ids = struct.pack("<3i", 1, 2, 3)
t1 = tensor("model/fc.weight", [3, 4], "float32", [chunk(f0, 0, 6, 0, w[:24]), chunk(f1, 6, 12, 0, w[24:])])
t2 = tensor("model/emb", [5], "bfloat16", [chunk(f0, 0, 5, 24, b16)])
t3 = tensor("optim.step", [1], "int32", [chunk(f1, 0, 1, 24, ids[:4])])
t4 = tensor("empty", [0, 4], "float32", [])
def meta(version):
    body = f_varint(1, version) + f_varint(2, 2) + f_varint(3, 60)
    body += f_bytes(4, f_bytes(1, "run") + f_bytes(2, "alpha"))  # map entry
    body += f_varint(5, block)
    for t in (t1, t2, t3, t4): body += f_bytes(6, t)
    body += f_bytes(7, f_bytes(1, f0) + f_varint(2, 0) + f_varint(3, 34))
    body += f_bytes(7, f_bytes(1, f1) + f_varint(2, 1) + f_varint(3, 28))
    body += f_bytes(8, f_bytes(1, "fsdp.training") + f_bytes(2, b"\x08\x01\x12\x00"))
    return body
body = meta(2)
hdr = b"FSDPCKPT" + struct.pack("<IQI", 2, len(body), crc32c(body))
hdr += struct.pack("<I", crc32c(hdr))
d = os.path.join(root, "checkpoint/testdata/metadata_fuzz_corpus")
os.makedirs(d, exist_ok=True)
for f in os.listdir(d): os.remove(os.path.join(d, f))
open(os.path.join(d, "two_ranks_metadata.pb"), "wb").write(hdr + body)
open(os.path.join(d, "two_ranks_body.bin"), "wb").write(body)
open(os.path.join(d, "version_1_metadata.pb"), "wb").write(meta(1))
one = f_varint(1, 2) + f_varint(2, 1) + f_varint(5, 16) + f_bytes(6, tensor("a", [2], "float32", [chunk("rank-00000-of-00001.bin", 0, 2, 0, b"\0" * 8)])) + f_bytes(7, f_bytes(1, "rank-00000-of-00001.bin") + f_varint(3, 8))
hdr1 = b"FSDPCKPT" + struct.pack("<IQI", 2, len(one), crc32c(one)); hdr1 += struct.pack("<I", crc32c(hdr1))
open(os.path.join(d, "one_rank_metadata.pb"), "wb").write(hdr1 + one)

# safetensors
d = os.path.join(root, "checkpoint/testdata/safetensors_fuzz_corpus")
os.makedirs(d, exist_ok=True)
for f in os.listdir(d): os.remove(os.path.join(d, f))
def st(entries, metadata=None):
    header = {}
    if metadata is not None: header["__metadata__"] = metadata
    data = b""
    for name, dtype, shape, raw in entries:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + data
open(os.path.join(d, "model.safetensors"), "wb").write(st([
    ("wte.weight", "F32", [2, 3], struct.pack("<6f", *range(6))),
    ("ln.bias", "BF16", [2], b"\x80\x3f\x00\x40"),
    ("ids", "I32", [3], struct.pack("<3i", 7, 8, 9)),
    ("scalar", "F32", [], struct.pack("<f", 1.5)),
    ("empty", "F32", [0, 4], b""),
], {"format": "pt"}))
open(os.path.join(d, "empty_header.safetensors"), "wb").write(st([]))
open(os.path.join(d, "f16_unsupported.safetensors"), "wb").write(st([("x", "F16", [2], b"\0\0\0\0")]))
