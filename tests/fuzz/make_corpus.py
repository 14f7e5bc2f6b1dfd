#!/usr/bin/python3
"""Writes the seed corpus of every fuzz target to tests/fuzz/corpus/<target>/ (committed; small).

Run from anywhere with Debian's python3 (numpy comes from python3-numpy):
    /usr/bin/python3 tests/fuzz/make_corpus.py
It rewrites every seed, so the corpus always matches this script. libFuzzer starts from these
files and mutates them; tools/scripts/fuzz runs on a copy, so fuzzing never writes here.
"""
import io
import os
import struct

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def write_seeds(target, seeds):
    out = os.path.join(HERE, "corpus", target)
    # Regression inputs (regress-*, added by hand from crashes) stay; the generated seeds are
    # rewritten.
    os.makedirs(out, exist_ok=True)
    for name in os.listdir(out):
        if not name.startswith("regress-"):
            os.remove(os.path.join(out, name))
    for name, data in seeds.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)


def npy_bytes(array, version=None):
    buf = io.BytesIO()
    np.lib.format.write_array(buf, array, version=version, allow_pickle=False)
    return buf.getvalue()


def npy_by_hand(header, data=b"", major=1):
    """A .npy file with this exact header text (no padding), to seed the parser's rarer syntax."""
    header = header.encode("latin-1")
    length = struct.pack("<H" if major == 1 else "<I", len(header))
    return b"\x93NUMPY" + bytes([major, 0]) + length + header + data


def npy_seeds():
    rng = np.random.default_rng(11)
    return {
        "f4_2x3.npy": npy_bytes(rng.standard_normal((2, 3)).astype("<f4")),
        "f8_vector.npy": npy_bytes(np.array([0.5, -np.inf, np.nan], dtype="<f8")),
        "b1_3d.npy": npy_bytes(rng.integers(0, 2, (2, 1, 3)).astype("|b1")),
        "i4_scalar.npy": npy_bytes(np.array(7, dtype="<i4")),
        "i8_lengths_v2.npy": npy_bytes(np.array([1, 5], dtype="<i8"), version=(2, 0)),
        "f4_empty_v3.npy": npy_bytes(np.zeros((0, 4), dtype="<f4"), version=(3, 0)),
        # Valid syntax NumPy itself does not write: double quotes, a Python 2 long, no spaces.
        "python2_long.npy": npy_by_hand('{"descr":"<i4","fortran_order":False,"shape":(2L,)}\n',
                                        struct.pack("<2i", 3, 4)),
        # Rejected on purpose: Fortran order and a big-endian dtype (their error paths).
        "fortran.npy": npy_by_hand("{'descr': '<f4', 'fortran_order': True, 'shape': (1,), }\n",
                                   b"\0\0\0\0"),
        "big_endian.npy": npy_by_hand("{'descr': '>f8', 'fortran_order': False, 'shape': (), }\n",
                                      b"\0" * 8, major=2),
    }


def labels_seeds():
    return {
        "ascii.txt": b"the\ncat\nsat\n",
        "bom_crlf.txt": b"\xef\xbb\xbfone\r\ntwo\r\n\r\nfour",
        "utf8.txt": "caf\u00e9\n\u6f22\u5b57\n\U0001f600 emoji\n\ttab".encode("utf-8"),
        "xml_specials.txt": b"<b>&amp;\n'quote' \"double\"\na > b & c < d",
        "empty_lines.txt": b"\n\n",
        "invalid_utf8.txt": b"ok\n\xc0\xaf overlong\n",
        "control.txt": b"bell\x07\n",
    }


def decision_seeds(count, length):
    """Seeds for the targets that read their input as a stream of decisions (fuzz_util.h's
    Reader: a byte per choice, 0 past the end). All zeros is the simplest valid case (every
    size 1, no option); all 0xff turns every option on; the rest are fixed pseudo-random streams,
    different mixes of options and mutations for libFuzzer to start from."""
    rng = np.random.default_rng(42)
    seeds = {"zeros": bytes(length), "all_ff": b"\xff" * length}
    for i in range(count):
        seeds["random_%d" % i] = rng.integers(0, 256, length, dtype=np.uint8).tobytes()
    return seeds


def main():
    write_seeds("fuzz_npy", npy_seeds())
    write_seeds("fuzz_labels", labels_seeds())
    write_seeds("fuzz_validate", decision_seeds(6, 64))
    write_seeds("fuzz_attention_diff", decision_seeds(6, 96))
    write_seeds("fuzz_kvcache", decision_seeds(6, 128))
    write_seeds("fuzz_paged", decision_seeds(6, 96))


if __name__ == "__main__":
    main()
