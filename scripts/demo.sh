#!/usr/bin/env bash
# The main job of ckptfs, end to end, on a fresh Debian 12 machine:
#   1. install what is missing and build;
#   2. mount ckptfs over an empty backing directory;
#   3. train a small CNN (scikit-learn digits) that saves checkpoints with
#      plain torch.save into the mount, unchanged;
#   4. show the stored size of every checkpoint next to zstd -3;
#   5. read the checkpoints back with torch.load and evaluate the model;
#   6. unmount, then inspect and check the store offline.
# Environment: CKPTFS_DEMO_DIR (default: a new temporary directory),
#              CKPTFS_DEMO_STEPS (default 300).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
source scripts/lib/deps.sh
ckptfs_install_deps
echo "== build"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
ninja -C build ckptfs >/dev/null
ckptfs="$root/build/mount-tools/ckptfs"

work=${CKPTFS_DEMO_DIR:-$(mktemp -d -t ckptfs-demo.XXXXXX)}
backing="$work/backing"
mnt="$work/mnt"
mkdir -p "$backing" "$mnt"
cleanup() { mountpoint -q "$mnt" && { "$ckptfs" umount "$mnt" || fusermount3 -uz "$mnt"; }; true; }
trap cleanup EXIT

echo "== mount $backing at $mnt"
"$ckptfs" mount "$backing" "$mnt"

echo "== train, saving checkpoints into the mount"
"$CKPTFS_PYTHON" scripts/demo/train_digits.py --out "$mnt/run" --steps "${CKPTFS_DEMO_STEPS:-300}" --save-every 50

echo "== stored sizes (ckptfs) next to zstd -3 of the same bytes"
"$ckptfs" umount "$mnt"   # waits for every pending encode
"$ckptfs" mount "$backing" "$mnt"
printf '%-18s %12s %12s %8s %12s %8s\n' file bytes ckptfs ratio zstd-3 ratio
for f in "$mnt"/run/*.pt; do
  logical=$(stat -c %s "$f")
  stored=$(getfattr --only-values -n user.ckptfs.stored_bytes "$f" 2>/dev/null || echo 0)
  z=$(zstd -q -3 -c "$f" | wc -c)
  awk -v n="$(basename "$f")" -v l="$logical" -v s="$stored" -v z="$z" \
    'BEGIN { printf "%-18s %12d %12d %7.2fx %12d %7.2fx\n", n, l, s, (s ? l / s : 0), z, l / z }'
done
"$ckptfs" stats "$mnt/run"

echo "== read back with torch.load and evaluate"
"$CKPTFS_PYTHON" - "$mnt/run" <<'PY'
import glob, sys
import torch
sys.path.insert(0, "scripts/demo")
from train_digits import DigitsNet, load_data, evaluate
torch.set_num_threads(2)
_, test = load_data()
for path in sorted(glob.glob(sys.argv[1] + "/*.pt")):
    ckpt = torch.load(path)
    model = DigitsNet(32)
    model.load_state_dict({k: v.float() for k, v in ckpt["model"].items()})
    loss, acc = evaluate(model, test)
    print(f"{path.split('/')[-1]}: step {ckpt['step']}, test loss {loss:.4f}, accuracy {acc:.4f}")
PY

echo "== unmount, then inspect and check the store offline"
"$ckptfs" umount "$mnt"
last=$(ls "$backing/run" | sort | tail -1)
"$ckptfs" inspect "$backing/run/$last"
"$ckptfs" fsck "$backing"
echo "== done: the store is in $backing"
