"""Storage backends the experiments write checkpoints into.

  plain                 a normal directory (the baseline)
  ckptfs-lossless       a ckptfs mount with -o lossy=off (or no lossy option
                        when the mount does not know it yet)
  ckptfs-lossy:BUDGET   a ckptfs mount with -o lossy=on,budget=BUDGET
                        (optionally ckptfs-lossy:BUDGET:OPT_BUDGET adds
                        opt_budget=OPT_BUDGET)
  ckptfs-level:NAME     a ckptfs mount with -o level=NAME (a preset, as a user picks it)
  ckptfs-policy:NAME    a ckptfs mount with -o policy=scripts/eval/policies/NAME.toml

Any ckptfs backend takes further mount options after '+', e.g.
ckptfs-lossy:3e-2+schedule=dsq (',' separates backends in --backends).

A backend is used as:  b.start(workdir) -> directory to write into;
b.cycle() (unmount and remount so later reads decode from the store rather
than from staging files or the page cache); b.stop(); b.stats() per-file
logical/stored bytes. b.probe(workdir) returns None when the backend works
here, else the reason it does not (reported as "not run", never faked).
"""
import json
import os
import re
import shutil
import subprocess
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CKPTFS = os.environ.get("CKPTFS_BIN", os.path.join(REPO, "build", "mount-tools", "ckptfs"))


def fuse_problem():
    """None when FUSE mounts can work here, else why not."""
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    try:
        os.close(os.open("/dev/fuse", os.O_RDWR))
    except OSError as e:
        return f"/dev/fuse is not usable: {e}"
    if not os.access(CKPTFS, os.X_OK):
        return f"ckptfs binary not found at {CKPTFS} (build it or set CKPTFS_BIN)"
    return None


def is_mounted(path):
    path = os.path.realpath(path)
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == path for line in f)


def force_unmount(path):
    """Best effort: ckptfs umount, then fusermount3 -uz."""
    if not is_mounted(path):
        return
    subprocess.run([CKPTFS, "umount", path], capture_output=True, timeout=900)
    if is_mounted(path):
        subprocess.run(["fusermount3", "-uz", path], capture_output=True)


class Plain:
    name = "plain"
    lossy = False

    def probe(self, workdir):
        return None

    def start(self, workdir):
        self.dir = os.path.join(workdir, "plain")
        os.makedirs(self.dir, exist_ok=True)
        return self.dir

    def cycle(self):
        pass

    def wait_idle(self):
        pass

    def stop(self):
        pass

    def stats(self):
        out = {}
        for root, _, files in os.walk(self.dir):
            for f in files:
                p = os.path.join(root, f)
                size = os.path.getsize(p)
                out[os.path.relpath(p, self.dir)] = {"logical_bytes": size, "stored_bytes": size}
        return out


class Ckptfs:
    def __init__(self, name, options):
        self.name = name
        self.options = options  # list of "key=value" strings
        # Every level but lossless is lossy.
        self.lossy = any(o == "lossy=on" or (o.startswith("level=") and o != "level=lossless") for o in options)
        self.backing = self.mnt = None

    def _mount(self):
        opts = ",".join([f"log={self.log}", "loglevel=warn", "gc_interval=0"] + self.options)
        r = subprocess.run([CKPTFS, "mount", self.backing, self.mnt, "-o", opts],
                           capture_output=True, text=True)
        if r.returncode != 0:
            # The message leaves out the scratch paths (log=...): it lands in reports.
            raise RuntimeError(f"ckptfs mount -o {','.join(self.options) or '(defaults)'} failed "
                               f"(exit {r.returncode}): {r.stderr.strip()}")

    def probe(self, workdir):
        why = fuse_problem()
        if why:
            return why
        d = os.path.join(workdir, f"probe-{self.name.replace(':', '_')}")
        self.backing, self.mnt, self.log = d + "/backing", d + "/mnt", d + "/ckptfs.log"
        os.makedirs(self.backing, exist_ok=True)
        os.makedirs(self.mnt, exist_ok=True)
        try:
            self._mount()
        except RuntimeError as e:
            return str(e)
        finally:
            force_unmount(self.mnt)
        shutil.rmtree(d, ignore_errors=True)
        return None

    def start(self, workdir):
        d = os.path.join(workdir, self.name.replace(":", "_"))
        self.backing, self.mnt, self.log = d + "/backing", d + "/mnt", d + "/ckptfs.log"
        os.makedirs(self.backing, exist_ok=True)
        os.makedirs(self.mnt, exist_ok=True)
        self._mount()
        return self.mnt

    def wait_idle(self, timeout=900):
        deadline = time.time() + timeout
        while int(os.getxattr(self.mnt, "user.ckptfs.pending")) != 0:
            if time.time() > deadline:
                raise RuntimeError("encodes still pending after %d s" % timeout)
            time.sleep(0.02)

    def stop(self):
        r = subprocess.run([CKPTFS, "umount", self.mnt], capture_output=True, text=True, timeout=900)
        if r.returncode != 0 or is_mounted(self.mnt):
            force_unmount(self.mnt)
            raise RuntimeError(f"ckptfs umount {self.mnt} failed: {r.stderr.strip()}")

    def cycle(self):
        self.stop()
        self._mount()

    def teardown(self):
        if self.mnt:
            force_unmount(self.mnt)

    def stats(self):
        """{relative path: {logical_bytes, stored_bytes, ...}} from
        `ckptfs stats --json` on the (mounted or unmounted) store."""
        target = self.mnt if is_mounted(self.mnt) else self.backing
        r = subprocess.run([CKPTFS, "stats", target, "--json"], capture_output=True, text=True, check=True)
        files = json.loads(r.stdout)["files"]
        out = {}
        for f in files:
            path = f["path"]
            for root in (self.mnt, self.backing):
                if path.startswith(root + "/"):
                    path = path[len(root) + 1:]
            out[path] = f
        return out

    def inspect(self, relpath):
        """`ckptfs inspect --json` of a file of the unmounted store."""
        r = subprocess.run([CKPTFS, "inspect", os.path.join(self.backing, relpath), "--json"],
                           capture_output=True, text=True, check=True)
        return json.loads(r.stdout)


def make(spec):
    """A backend from its name: plain | ckptfs-lossless | ckptfs-lossy:B[:OB] | ckptfs-level:NAME (a
    `-o level=` preset as a user mounts it) | ckptfs-policy:NAME, each ckptfs one optionally followed by
    +KEY=VALUE mount options."""
    if spec == "plain":
        return Plain()
    base, *extra = spec.split("+")
    for opt in extra:
        if not re.fullmatch(r"[a-z_]+=[A-Za-z0-9_.-]+", opt):
            raise ValueError(f"backend '{spec}': '{opt}' is not a KEY=VALUE mount option")
    if base == "ckptfs-lossless":
        return Ckptfs(spec, ["lossy=off"] + extra)
    if base.startswith("ckptfs-lossy:"):
        parts = base.split(":")[1:]
        opts = ["lossy=on", f"budget={float(parts[0]):g}"]
        if len(parts) > 1:
            opts.append(f"opt_budget={float(parts[1]):g}")
        return Ckptfs(spec, opts + extra)
    if base.startswith("ckptfs-level:"):
        name = base.split(":", 1)[1]
        if not re.fullmatch(r"[a-z]+", name):
            raise ValueError(f"backend '{spec}': '{name}' is not a level name")
        return Ckptfs(spec, [f"level={name}"] + extra)
    if base.startswith("ckptfs-policy:"):
        name = base.split(":", 1)[1]
        path = os.path.join(REPO, "scripts", "eval", "policies", name + ".toml")
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", name) or not os.path.isfile(path):
            raise ValueError(f"backend '{spec}': no policy file {path}")
        return Ckptfs(spec, ["lossy=on", f"policy={path}"] + extra)
    raise ValueError(f"unknown backend '{spec}' (want plain | ckptfs-lossless | ckptfs-lossy:BUDGET[:OPT_BUDGET]"
                     " | ckptfs-level:NAME | ckptfs-policy:NAME, optionally +KEY=VALUE ...)")


def probe_lossless_options(backend, workdir):
    """ckptfs-lossless with -o lossy=off when the mount accepts it, else with
    the defaults (lossless before the lossy codec exists). Returns the reason
    when neither mounts."""
    why = backend.probe(workdir)
    if why and "unknown option" in why and "lossy" in why:
        backend.options = [o for o in backend.options if o != "lossy=off"]
        backend.note = "mounted without -o lossy=off (option not known to this build; lossless is its only mode)"
        why = backend.probe(workdir)
    return why


def runnable(specs, expdir, results, log, tag):
    """Yields (spec, backend, workdir) for each backend in the comma-separated
    `specs` that mounts; the others are recorded in results["backends"] as
    "not run" with the mount's reason (never estimated)."""
    for spec in [s for s in specs.split(",") if s]:
        backend = make(spec)
        work = os.path.join(expdir, spec.replace(":", "_"))
        why = probe_lossless_options(backend, work) if spec == "ckptfs-lossless" else backend.probe(work)
        if why:
            log(f"[{tag}] {spec}: not run: {why}")
            results["backends"][spec] = {"status": "not run", "reason": why}
            continue
        yield spec, backend, work
