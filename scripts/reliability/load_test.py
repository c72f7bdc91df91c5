"""Load test of a ckptfs mount: concurrent checkpoint writers, many small
files, reads of files whose encode is still pending, and the daemon's peak
memory. Prints one JSON object; exit status 1 if any byte read back differs.

  load_test.py --ckptfs BIN --work DIR [--writers 8] [--mb 200] [--small 1000]
               [--variant NAME=OPTS ...]

Each --variant (default: "default=" and "mem256=mem=256") runs the whole
load on a fresh store mounted with `lossy=off,gc_interval=0,OPTS`, side by
side in one run:
  - `writers` processes each torch.save a model + Adam-like state of about
    `mb` MB (fp32 weights, exp_avg, exp_avg_sq, step counters) into the
    mount, all starting together; right after close() each reads its file
    back (its encode is then usually queued or running: the read is served
    from the staging file) and compares SHA-256;
  - one process writes `small` files of 0..256 KiB (some inline-sized) and
    reads each back right after close();
  - the parent samples the daemon's /proc/PID/status every 20 ms.
Then it waits until nothing is pending, unmounts, remounts (cold daemon
caches), and reads every file back from the store.

Reported per variant: write_s (start until the last close), committed_s
(start until nothing pending), verify_s (remount and read all), the daemon's
VmHWM and the largest RssAnon/RssFile sampled (MiB), reads_while_pending,
mismatches (must be 0), stored/logical bytes.
"""
import argparse
import hashlib
import json
import multiprocessing as mp
import os
import random
import shutil
import subprocess
import sys
import threading
import time

MIB = 1 << 20


def is_mounted(path):
    path = os.path.realpath(path)
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == path for line in f)


def mount(ckptfs, backing, mnt, opts, log):
    o = f"log={log},gc_interval=0,lossy=off" + ("," + opts if opts else "")
    r = subprocess.run([ckptfs, "mount", backing, mnt, "-o", o], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"mount -o {o} failed ({r.returncode}): {r.stderr}")
    return int(os.getxattr(mnt, "user.ckptfs.pid"))


def umount(ckptfs, mnt):
    r = subprocess.run([ckptfs, "umount", mnt], capture_output=True, text=True)
    if r.returncode != 0 or is_mounted(mnt):
        subprocess.run(["fusermount3", "-uz", mnt], capture_output=True)
        raise RuntimeError(f"umount failed: {r.stderr}")


def proc_status(pid):
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("VmHWM", "VmRSS", "RssAnon", "RssFile", "RssShmem"):
                    out[key] = int(rest.split()[0]) / 1024.0  # kB -> MiB
    except FileNotFoundError:
        pass
    return out


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(4 * MIB)
            if not b:
                return h.hexdigest()
            h.update(b)


def checkpoint_bytes(seed, mb):
    """torch.save bytes of a model + Adam-like optimizer state of ~mb MB."""
    import io

    import torch

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(seed)
    params = max(1, int(mb * 1e6) // 12)  # weights + exp_avg + exp_avg_sq, fp32
    shapes, left, i = [], params, 0
    while left > 0:  # layers of ~1M..4M parameters
        n = min(left, (1 << 20) * (1 + i % 4))
        shapes.append((n // 1024, 1024) if n >= 1024 else (n,))
        left -= n
        i += 1
    model = {f"layer{i}.weight": torch.randn(s, generator=g) * 0.02 for i, s in enumerate(shapes)}
    state = {}
    for i, (name, w) in enumerate(model.items()):
        state[i] = {"step": torch.tensor(100.0), "exp_avg": w * 0.1 + torch.randn(w.shape, generator=g) * 1e-4,
                    "exp_avg_sq": (torch.randn(w.shape, generator=g) * 1e-6).abs()}
    buf = io.BytesIO()
    torch.save({"model": model, "optimizer": {"state": state, "param_groups": [{"lr": 1e-3}]}, "epoch": seed},
               buf)
    return buf.getvalue()


def write_and_check(path, data):
    """Writes `data`, closes, reads back at once. Returns (state, ok)."""
    with open(path, "wb") as f:
        for off in range(0, len(data), MIB):
            f.write(data[off:off + MIB])
    try:
        st = os.getxattr(path, "user.ckptfs.state").decode()
    except OSError:
        st = "?"
    with open(path, "rb") as f:
        ok = hashlib.sha256(f.read()).hexdigest() == hashlib.sha256(data).hexdigest()
    return st, ok


def big_writer(idx, mnt, mb, barrier, out):
    data = checkpoint_bytes(idx, mb)
    barrier.wait()
    st, ok = write_and_check(os.path.join(mnt, f"ckpt{idx}.pt"), data)
    out.put(("big", idx, hashlib.sha256(data).hexdigest(), len(data), st, ok))


def small_writer(mnt, count, barrier, out):
    rng = random.Random(1234)
    os.makedirs(os.path.join(mnt, "small"), exist_ok=True)
    digests, pending, bad = {}, 0, 0
    barrier.wait()
    for i in range(count):
        size = rng.choice([0, 1, rng.randrange(2, 3073), rng.randrange(3073, 256 * 1024)])
        data = rng.randbytes(size) if i % 2 else bytes(size // 2) + rng.randbytes(size - size // 2)
        st, ok = write_and_check(os.path.join(mnt, "small", f"f{i:04d}"), data)
        pending += st in ("staging", "encoding")
        bad += not ok
        digests[f"small/f{i:04d}"] = hashlib.sha256(data).hexdigest()
    out.put(("small", digests, pending, bad))


def sampler(pid, stop, peaks):
    while not stop.is_set():
        s = proc_status(pid)
        for k, v in s.items():
            peaks[k] = max(peaks.get(k, 0.0), v)
        time.sleep(0.02)


def run_variant(args, name, opts):
    root = os.path.join(args.work, name)
    shutil.rmtree(root, ignore_errors=True)
    backing, mnt, log = os.path.join(root, "backing"), os.path.join(root, "mnt"), os.path.join(root, "ckptfs.log")
    os.makedirs(backing)
    os.makedirs(mnt)
    pid = mount(args.ckptfs, backing, mnt, opts, log)
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(args.writers + 2)
    out = ctx.Queue()
    procs = [ctx.Process(target=big_writer, args=(i, mnt, args.mb, barrier, out)) for i in range(args.writers)]
    procs.append(ctx.Process(target=small_writer, args=(mnt, args.small, barrier, out)))
    for p in procs:
        p.start()
    barrier.wait()  # every checkpoint is in memory: start the clock
    t0 = time.monotonic()
    stop, peaks = threading.Event(), {}
    th = threading.Thread(target=sampler, args=(pid, stop, peaks))
    th.start()
    results = [out.get() for _ in procs]
    write_s = time.monotonic() - t0
    for p in procs:
        p.join()
    while int(os.getxattr(mnt, "user.ckptfs.pending")) != 0:
        time.sleep(0.05)
    committed_s = time.monotonic() - t0
    stop.set()
    th.join()
    hwm = proc_status(pid).get("VmHWM", 0.0)
    expected, mismatches, while_pending, logical = {}, 0, 0, 0
    for r in results:
        if r[0] == "big":
            _, idx, digest, size, st, ok = r
            expected[f"ckpt{idx}.pt"] = digest
            mismatches += not ok
            while_pending += st in ("staging", "encoding")
            logical += size
        else:
            expected.update(r[1])
            while_pending += r[2]
            mismatches += r[3]
    stored = sum(int(os.getxattr(os.path.join(mnt, f), "user.ckptfs.stored_bytes")) for f in expected)
    umount(args.ckptfs, mnt)
    mount(args.ckptfs, backing, mnt, opts, log)
    t1 = time.monotonic()
    for rel, digest in expected.items():
        if sha256_file(os.path.join(mnt, rel)) != digest:
            mismatches += 1
            print(f"{name}: {rel} differs after remount", file=sys.stderr)
    verify_s = time.monotonic() - t1
    umount(args.ckptfs, mnt)
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    return {"options": opts, "files": len(expected), "logical_mb": round(logical / 1e6, 1),
            "stored_mb": round(stored / 1e6, 1), "write_s": round(write_s, 2), "committed_s": round(committed_s, 2),
            "verify_s": round(verify_s, 2), "vm_hwm_mib": round(hwm, 1),
            "max_rss_anon_mib": round(peaks.get("RssAnon", 0), 1),
            "max_rss_file_mib": round(peaks.get("RssFile", 0), 1), "reads_while_pending": while_pending,
            "mismatches": mismatches}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ckptfs", required=True)
    ap.add_argument("--work", required=True, help="scratch directory (backing stores and mountpoints)")
    ap.add_argument("--writers", type=int, default=8)
    ap.add_argument("--mb", type=float, default=200, help="size of each checkpoint (MB)")
    ap.add_argument("--small", type=int, default=1000)
    ap.add_argument("--variant", action="append", help="NAME=MOUNT_OPTS (repeatable)")
    ap.add_argument("--keep", action="store_true", help="keep the stores")
    args = ap.parse_args()
    import torch  # noqa: F401  (imported once here: the forked writers share it)

    variants = args.variant or ["default=", "mem256=mem=256"]
    report = {"writers": args.writers, "mb": args.mb, "small": args.small, "variants": {}}
    for v in variants:
        name, _, opts = v.partition("=")
        report["variants"][name] = run_variant(args, name, opts)
    print(json.dumps(report, indent=2))
    return 1 if any(r["mismatches"] for r in report["variants"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
