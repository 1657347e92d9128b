#!/usr/bin/env python3
"""Turns a text file into a token file for data::TokenFile (data/token_file.h).

Each byte of the text is one token (ids 0..255; a model needs vocab_size >= 256), written
in llm.c's layout: a header of 256 little-endian int32 (magic 20240520, version 1, token
count) followed by the tokens as uint16. No tokenizer, no download.

    python3 tools/text_to_tokens.py /usr/share/common-licenses/GPL-3 /tmp/gpl3.bin
    python3 tools/text_to_tokens.py --val_fraction=0.1 TEXT OUT_PREFIX   # OUT_PREFIX_{train,val}.bin
"""
import argparse
import struct
import sys

MAGIC, VERSION = 20240520, 1


def write(path, data):
    header = struct.pack("<256i", MAGIC, VERSION, len(data), *([0] * 253))
    with open(path, "wb") as out:
        out.write(header)
        out.write(struct.pack(f"<{len(data)}H", *data))
    print(f"{path}: {len(data)} tokens")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("text")
    p.add_argument("out", help="the .bin file, or the prefix of _train.bin and _val.bin with --val_fraction")
    p.add_argument("--val_fraction", type=float, default=0.0,
                   help="the last this fraction of the text goes to OUT_val.bin (0: one file)")
    a = p.parse_args()
    try:
        with open(a.text, "rb") as f:
            data = f.read()
    except OSError as e:
        sys.exit(f"text_to_tokens: cannot read {a.text}: {e}")
    if not data:
        sys.exit(f"text_to_tokens: {a.text} is empty")
    if not 0.0 <= a.val_fraction < 1.0:
        sys.exit(f"text_to_tokens: --val_fraction={a.val_fraction} must be in [0, 1)")
    if a.val_fraction == 0.0:
        write(a.out, data)
        return
    cut = len(data) - int(len(data) * a.val_fraction)
    write(a.out + "_train.bin", data[:cut])
    write(a.out + "_val.bin", data[cut:])


if __name__ == "__main__":
    main()
