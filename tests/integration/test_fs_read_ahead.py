"""Decoding ahead of sequential readers (fs/read_ahead.h): reads stay
correct while the daemon decodes chunks ahead, drops the chunks a stream
has passed, and the file is replaced or rewritten under an open reader."""
import hashlib
import os

import pytest

np = pytest.importorskip("numpy")

MIB = 1 << 20


def npy_bytes(values):
    import io

    buf = io.BytesIO()
    np.save(buf, values)
    return buf.getvalue()


def version(n):
    # 24 MB of float32 in 4 MiB chunks; every version has the same layout,
    # so a stale chunk of another version would fit in exactly.
    rng = np.random.default_rng(7)
    return npy_bytes((rng.standard_normal(6 << 20, dtype=np.float32) + n).astype(np.float32))


def write(path, data):
    with open(path, "wb") as f:
        f.write(data)


def read_all(fd, size, step=MIB, order=None):
    out = bytearray(size)
    for off in order if order is not None else range(0, size, step):
        chunk = os.pread(fd, step, off)
        out[off : off + len(chunk)] = chunk
    return bytes(out)


def drop_page_cache(fd):
    # The next reads go to the daemon again instead of the kernel's cache.
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)


def test_replaced_file_never_reads_old_chunks(mnt):
    v1, v2, v3 = version(1), version(2), version(3)
    path = mnt.path("ckpt.npy")
    write(path, v1)
    mnt.wait_idle()

    old = os.open(path, os.O_RDONLY)
    try:
        # A sequential reader halfway through v1: the daemon decodes ahead.
        assert read_all(old, 12 * MIB) == v1[: 12 * MIB]
        # Replace by rename while the reader is open.
        write(mnt.path("ckpt.npy.tmp"), v2)
        os.replace(mnt.path("ckpt.npy.tmp"), path)
        mnt.wait_idle()
        fd = os.open(path, os.O_RDONLY)
        try:
            assert hashlib.sha256(read_all(fd, len(v2))).digest() == hashlib.sha256(v2).digest()
        finally:
            os.close(fd)
        # The open reader keeps reading the file it opened (POSIX rename).
        rest = read_all(old, len(v1), order=range(12 * MIB, len(v1), MIB))[12 * MIB :]
        assert rest == v1[12 * MIB :]

        # Rewrite in place (same inode) under a reader that is decoding ahead.
        fd = os.open(path, os.O_RDONLY)
        try:
            assert read_all(fd, 8 * MIB) == v2[: 8 * MIB]
            write(path, v3)
            mnt.wait_idle()
            drop_page_cache(fd)
            assert hashlib.sha256(read_all(fd, len(v3))).digest() == hashlib.sha256(v3).digest()
        finally:
            os.close(fd)
    finally:
        os.close(old)


def test_reads_after_chunks_were_dropped(mnt):
    data = version(5)
    path = mnt.path("big.npy")
    write(path, data)
    mnt.wait_idle()
    fd = os.open(path, os.O_RDONLY)
    try:
        # Sequentially to the end (the stream drops what it passed), then
        # backwards and strided from the daemon again: dropped chunks are
        # decoded again, never served from recycled memory.
        assert read_all(fd, len(data)) == data
        drop_page_cache(fd)
        backwards = range((len(data) - 1) // MIB * MIB, -1, -MIB)
        assert read_all(fd, len(data), order=backwards) == data
        drop_page_cache(fd)
        strided = [off for start in range(3) for off in range(start * MIB, len(data), 3 * MIB)]
        assert read_all(fd, len(data), order=strided) == data
    finally:
        os.close(fd)


def test_decode_ahead_off_reads_the_same(store):
    data = version(6)
    store.mount("decode_ahead=0")
    try:
        write(store.path("f.npy"), data)
        store.wait_idle()
        with open(store.path("f.npy"), "rb") as f:
            assert f.read() == data
    finally:
        store.umount()
