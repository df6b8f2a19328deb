"""TFRecord fixtures for tests/test_data_tfrecord.cpp, and the reference reader's view of a file.

  python make_tfrecord_fixtures.py make OUTDIR   writes the fixtures and OUTDIR/meta.txt
  python make_tfrecord_fixtures.py dump FILE     prints FILE's records as the `tfrecord` package decodes them

`make` needs only the standard library: tf.train.Example is encoded by hand (so that packed and
unpacked repeated fields can both be written) and CRC-32C is computed here, or by the `crc32c`
package where it is installed. `dump` needs the `tfrecord` package (PyPI; it parses with protobuf);
without it, it prints "SKIPPED: ..." and exits 0.

dump's output, one line each:  R <index>  then per feature, in name order,
  F <name> bytes <count> <hex of each value>      F <name> float <count> <float.hex() of each>
  F <name> int64 <count> <each value>
"""
import gzip
import os
import struct
import sys

try:
    import crc32c as _crc32c_pkg

    def crc32c(data):
        return _crc32c_pkg.crc32c(bytes(data))
except ImportError:
    _TABLE = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        _TABLE.append(c)

    def crc32c(data):
        c = 0xFFFFFFFF
        for b in data:
            c = _TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
        return c ^ 0xFFFFFFFF


def masked_crc(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def frame(record, bad_length_crc=False, bad_data_crc=False):
    length = struct.pack("<Q", len(record))
    lcrc = masked_crc(length) ^ (1 if bad_length_crc else 0)
    dcrc = masked_crc(record) ^ (0x100 if bad_data_crc else 0)
    return length + struct.pack("<I", lcrc) + record + struct.pack("<I", dcrc)


def varint(v):
    v &= 0xFFFFFFFFFFFFFFFF  # negative int64 values: ten bytes, two's complement
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def field(number, wire, payload):
    key = varint(number << 3 | wire)
    if wire == 2:
        return key + varint(len(payload)) + payload
    return key + payload


def feature(kind, values, packed=True):
    """kind: 'bytes', 'float' or 'int64'; numbers packed (one length-delimited field) or not."""
    if kind == "bytes":
        body = b"".join(field(1, 2, v) for v in values)
        return field(1, 2, body)
    if kind == "float":
        if packed:
            body = field(1, 2, b"".join(struct.pack("<f", v) for v in values)) if values else b""
        else:
            body = b"".join(field(1, 5, struct.pack("<f", v)) for v in values)
        return field(2, 2, body)
    if packed:
        body = field(1, 2, b"".join(varint(v) for v in values)) if values else b""
    else:
        body = b"".join(field(1, 0, varint(v)) for v in values)
    return field(3, 2, body)


def example(features):
    """features: list of (name, kind, values, packed)."""
    entries = b"".join(
        field(1, 2, field(1, 2, name.encode()) + field(2, 2, feature(kind, values, packed)))
        for name, kind, values, packed in features
    )
    return field(1, 2, entries)


def sample(i):
    """Example i: every feature kind, packed and unpacked numbers, one and several bytes values."""
    image = bytes((i * 7 + k * 3 + 1) % 256 for k in range(6))  # a 2x3 uint8 image
    return example([
        ("image", "bytes", [image], True),
        ("label", "int64", [i % 10], True),
        ("ids", "int64", [i, -i - 1, 2**40 + i, -(2**62)], False),
        ("scores", "float", [0.5 * i, -1.25, 3.0e-3 * (i + 1)], True),
        ("weights", "float", [1.0 / (i + 3), 2.5], False),
        ("tags", "bytes", [b"ab%d" % (i % 10), b"cd%d" % (i % 10)], True),
        ("empty", "float", [], True),
    ])


def write(path, records):
    with open(path, "wb") as f:
        f.write(b"".join(records))


def make(out):
    os.makedirs(out, exist_ok=True)
    meta = []
    plain = [frame(sample(i)) for i in range(5)]
    write(os.path.join(out, "plain.tfrecord"), plain)
    with gzip.open(os.path.join(out, "plain.tfrecord.gz"), "wb") as f:
        f.write(b"".join(plain))
    # Three shards of 2, 3 and 1 records: examples 0..5 in name order.
    start = 0
    for k, n in enumerate([2, 3, 1]):
        write(os.path.join(out, "shard-%05d-of-00003" % k), [frame(sample(start + j)) for j in range(n)])
        start += n
    # Broken files: meta.txt says where the broken record starts.
    recs = [frame(sample(i)) for i in range(3)]
    bad = [recs[0], frame(sample(1), bad_length_crc=True), recs[2]]
    write(os.path.join(out, "bad_length_crc.tfrecord"), bad)
    meta.append("bad_length_crc.tfrecord %d" % len(recs[0]))
    bad = [recs[0], recs[1], frame(sample(2), bad_data_crc=True)]
    write(os.path.join(out, "bad_data_crc.tfrecord"), bad)
    meta.append("bad_data_crc.tfrecord %d" % (len(recs[0]) + len(recs[1])))
    cut = len(recs[2]) - 9
    write(os.path.join(out, "truncated.tfrecord"), [recs[0], recs[1], recs[2][:cut]])
    meta.append("truncated.tfrecord %d %d %d" % (len(recs[0]) + len(recs[1]), cut, len(recs[2])))
    # A record that frames correctly but whose Example has a group (wire type 3) at its byte 0.
    write(os.path.join(out, "bad_wire_type.tfrecord"), [recs[0], frame(b"\x0b\x0c")])
    meta.append("bad_wire_type.tfrecord %d" % len(recs[0]))
    with open(os.path.join(out, "meta.txt"), "w") as f:
        f.write("\n".join(meta) + "\n")


def dump(path):
    try:
        import numpy as np
        from tfrecord.reader import tfrecord_loader
    except ImportError as e:
        print("SKIPPED: the tfrecord package is not importable: %s" % e)
        return
    with open(path, "rb") as f:
        compression = "gzip" if f.read(2) == b"\x1f\x8b" else None
    for i, features in enumerate(tfrecord_loader(path, None, compression_type=compression)):
        print("R %d" % i)
        for name in sorted(features):
            v = features[name]
            if isinstance(v, bytes):
                print("F %s bytes 1 %s" % (name, v.hex()))
            elif v.dtype.kind == "S":
                print("F %s bytes %d %s" % (name, len(v), " ".join(bytes(x).hex() for x in v)))
            elif v.dtype == np.float32:
                print("F %s float %d %s" % (name, len(v), " ".join(float(x).hex() for x in v)))
            else:
                print("F %s int64 %d %s" % (name, len(v), " ".join(str(int(x)) for x in v)))


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("make", "dump"):
        sys.exit(__doc__)
    make(sys.argv[2]) if sys.argv[1] == "make" else dump(sys.argv[2])
