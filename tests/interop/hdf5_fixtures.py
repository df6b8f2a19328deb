"""Fixtures and checks for tests/test_data_hdf5.cpp (h5py and numpy).

  hdf5_fixtures.py make DIR    writes DIR/dtypes.h5 (every dtype in three layouts), the expected
                                values as .npy, and DIR/bad.h5 (inputs ember must refuse)
  hdf5_fixtures.py check FILE  reads an ember-written FILE and compares it with the values
                                written_value() computes; prints one "OK name" line per dataset

Prints "SKIPPED: ..." and exits 0 when h5py is not importable.
"""
import sys

try:
    import h5py
    import numpy as np
except ImportError as e:  # the C++ test reports the case as skipped
    print(f"SKIPPED: h5py is not importable ({e})")
    sys.exit(0)

N, ROW = 37, (3, 4)
# dtype name in the file -> what ember reads it as (the .npy written for comparison)
DTYPES = {
    "int8": "<i4", "int16": "<i4", "int32": "<i4", "int64": "<i8", "uint8": "|u1", "uint16": "<i4",
    "uint32": "<i8", "float16": "<f2", "float32": "<f4", "float64": "<f8", "bool": "|u1",
    ">i4": "<i4", ">f8": "<f8",  # big-endian files: HDF5 converts
}
LAYOUTS = {"contiguous": {}, "chunked": {"chunks": (5, 3, 4)},
           "gzip": {"chunks": (8, 3, 4), "compression": "gzip", "compression_opts": 6, "shuffle": True}}
# HDF5 1.10 (ember's reader) must open what h5py's newer HDF5 writes.
LIBVER = ("earliest", "v110")


def source_values(dtype):
    j = np.arange(N * 12, dtype=np.float64).reshape((N,) + ROW)
    if dtype == "bool":
        return (j.astype(np.int64) % 3 == 0)
    if dtype in ("float32", "float64", ">f8"):
        return (j * 0.37 - 5).astype(dtype)
    if dtype == "float16":
        return ((j % 61) - 30) * 0.5
    if dtype.startswith("u"):
        return (j.astype(np.int64) * 37 % 251 if dtype == "uint8" else j.astype(np.int64) * 40503 + 7).astype(dtype)
    info = np.iinfo(np.dtype(dtype))
    span = min(int(info.max) - int(info.min) + 1, 1 << 32)  # int64: the extremes come from the scale
    scale = 1 if info.bits < 64 else 1 << 31
    return (((j.astype(np.int64) * 2654435761) % span - span // 2) * scale).astype(dtype)


def bf16_type():
    t = h5py.h5t.IEEE_F32LE.copy()
    t.set_fields(15, 7, 8, 0, 7)
    t.set_size(2)
    t.set_ebias(127)
    return t


def make(out):
    with h5py.File(f"{out}/dtypes.h5", "w", libver=LIBVER) as f:
        for layout, kw in LAYOUTS.items():
            for dt, want in DTYPES.items():
                v = np.asarray(source_values(dt)).astype(dt)
                f.create_dataset(f"{layout}/{dt}", data=v, **kw)
                np.save(f"{out}/{layout}_{dt.replace('>', 'be_')}.npy", v.astype(want))
        # bfloat16 in HDF5 2.0's layout, written from its bit patterns; the expected bits as int32.
        bits = (np.arange(N * 12, dtype=np.int64).reshape((N,) + ROW) * 97 % 0x7f80).astype(np.uint16)
        bits[::2] |= 0x8000
        space = h5py.h5s.create_simple((N,) + ROW)
        ds = h5py.h5d.create(f.id, b"bf16", bf16_type(), space)
        ds.write(h5py.h5s.ALL, h5py.h5s.ALL, bits, mtype=bf16_type())
        np.save(f"{out}/bf16_bits.npy", bits.astype("<i4"))
        # Several fields with one sample axis; a label vector in a group.
        f.create_dataset("set/x", data=np.arange(N * 5, dtype=np.float32).reshape(N, 5))
        f.create_dataset("set/y", data=np.arange(N, dtype=np.int64) * 3)
    with h5py.File(f"{out}/bad.h5", "w", libver=LIBVER) as f:
        f.create_dataset("rows10", data=np.zeros((10, 2), np.float32))
        f.create_dataset("rows11", data=np.zeros((11,), np.int64))
        f.create_dataset("strings", data=np.array([b"a", b"bc"] * 5, dtype="S2"))
        f.create_dataset("uint64", data=np.arange(10, dtype=np.uint64))
        f.create_dataset("compound", data=np.zeros(10, dtype=[("a", "<i4"), ("b", "<f4")]))
        f.create_dataset("scalar", data=np.float32(1.5))
        f.create_group("group")
    print("OK make")


def written_value(name, dtype, shape):
    """What tests/test_data_hdf5.cpp's writer case writes: element k (row-major) of each dataset."""
    k = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
    if dtype == "float32":
        return (k * 0.37 - 5).astype(np.float32)
    if dtype == "float64":
        return k * 0.37 - 5
    if dtype == "float16":
        return (((k % 61) - 30) * 0.5).astype(np.float16)
    if dtype == "int32":
        return ((k * 2654435761) % 4294967296 - 2147483648).astype(np.int32)
    if dtype == "int64":
        return k * 1000003 - 7
    if dtype == "uint8":
        return (k * 37 % 251).astype(np.uint8)
    raise ValueError(dtype)


def check(path):
    with h5py.File(path, "r") as f:
        for name in sorted(f):
            ds = f[name]
            if name == "bfloat16":  # h5py has no numpy type for it: read its bit patterns
                bits = np.empty(ds.shape, np.uint16)
                ds.id.read(h5py.h5s.ALL, h5py.h5s.ALL, bits, mtype=bf16_type())
                k = np.arange(bits.size, dtype=np.int64).reshape(bits.shape)
                want = (((k % 61) - 30) * 0.5).astype(np.float32).view(np.uint32) >> 16
                ok = np.array_equal(bits.astype(np.uint32), want)
            else:
                got = ds[()]
                want = written_value(name, str(ds.dtype), ds.shape)
                ok = got.dtype == want.dtype and got.tobytes() == want.tobytes()
            layout = f"chunks={ds.chunks} compression={ds.compression}"
            print(("OK " if ok else "MISMATCH ") + f"{name} {ds.dtype} {ds.shape} {layout}")


if __name__ == "__main__":
    {"make": make, "check": check}[sys.argv[1]](sys.argv[2])
