#!/usr/bin/env bash
# A GlusterFS volume on loopback with two client mounts, "node A" and
# "node B", for ckptfs's shared-store tests and benchmarks (docs/cluster.md).
#
#   scripts/cluster/gluster.sh up     # idempotent; prints the two mounts
#   scripts/cluster/gluster.sh down   # idempotent; removes everything
#   scripts/cluster/gluster.sh status
#
# Environment:
#   GLUSTER_ROOT   where bricks, client mounts and glusterd's state live
#                  (default /var/tmp/ckptfs-gluster)
#   GLUSTER_VOLUME volume name (default ckptfs)
#   GLUSTER_CACHE  "strict" (default): no client-side caching, so one node
#                  sees another's renames and rewrites at once; "default":
#                  GlusterFS's own caching (about a second of staleness).
#
# Every port listens on 127.0.0.1 only. Needs root and the Debian packages
# glusterfs-server and glusterfs-client. Brick hosts must be a hostname, not
# 127.0.0.1: the machine's name is used, mapped to 127.0.0.1 in /etc/hosts
# when it does not resolve.
set -euo pipefail

ROOT=${GLUSTER_ROOT:-/var/tmp/ckptfs-gluster}
VOL=${GLUSTER_VOLUME:-ckptfs}
CACHE=${GLUSTER_CACHE:-strict}
HOST=$(hostname)
STATE="$ROOT/glusterd"        # glusterd's working directory
PIDFILE="$ROOT/glusterd.pid"
VOLFILE="$ROOT/glusterd.vol"
NODE_A="$ROOT/node-a"
NODE_B="$ROOT/node-b"

log() { echo "gluster.sh: $*" >&2; }
die() { log "$*"; exit 1; }

gcli() { timeout 60 gluster --mode=script --glusterd-sock="$STATE/glusterd.socket" "$@"; }

glusterd_running() { [[ -f $PIDFILE ]] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; }

is_mounted() { mountpoint -q "$1" 2>/dev/null; }

ensure_host() {
  if ! getent hosts "$HOST" >/dev/null; then
    log "mapping $HOST to 127.0.0.1 in /etc/hosts"
    echo "127.0.0.1 $HOST" >>/etc/hosts
  fi
  local addr
  addr=$(getent hosts "$HOST" | awk '{print $1; exit}')
  [[ $addr == 127.* ]] || die "$HOST resolves to $addr, not loopback; refusing (loopback traffic only)"
}

start_glusterd() {
  glusterd_running && return 0
  mkdir -p "$STATE" "$ROOT/log" "$ROOT/run"
  # glusterd's own volfile: its working directory under ROOT, every socket
  # bound to loopback (the bind address is inherited by the bricks).
  cat >"$VOLFILE" <<VOL
volume management
    type mgmt/glusterd
    option working-directory $STATE
    option transport-type socket
    option transport.socket.bind-address 127.0.0.1
    option transport.socket.listen-port 24007
    option transport.socket.read-fail-log off
    option ping-timeout 0
    option event-threads 1
    option glusterd-sockfile $STATE/glusterd.socket
    option run-directory $ROOT/run
end-volume
VOL
  /usr/sbin/glusterd -p "$PIDFILE" -f "$VOLFILE" -l "$ROOT/log/glusterd.log" \
    --xlator-option "*.glusterd-sockfile=$STATE/glusterd.socket"
  for _ in $(seq 100); do
    gcli pool list >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  die "glusterd did not answer (see $ROOT/log/glusterd.log)"
}

mount_client() {
  local dir=$1
  mkdir -p "$dir"
  is_mounted "$dir" && return 0
  local opts=()
  if [[ $CACHE == strict ]]; then
    # No cached attributes or entries, and the page cache purged at every
    # open: without --fopen-keep-cache=false a client keeps reading a file's
    # old bytes after another client rewrote it in place (as a manifest is).
    opts=(--attribute-timeout=0 --entry-timeout=0 --negative-timeout=0 --fopen-keep-cache=false)
  fi
  /usr/sbin/glusterfs --volfile-server="$HOST" --volfile-id="$VOL" "${opts[@]}" \
    --log-file="$ROOT/log/client-$(basename "$dir").log" "$dir"
  for _ in $(seq 100); do
    is_mounted "$dir" && return 0
    sleep 0.1
  done
  die "client mount $dir did not come up (see $ROOT/log/)"
}

up() {
  command -v glusterd >/dev/null || [[ -x /usr/sbin/glusterd ]] || die "glusterfs-server is not installed"
  [[ -x /usr/sbin/glusterfs ]] || die "glusterfs-client is not installed"
  ensure_host
  mkdir -p "$ROOT"
  start_glusterd
  if ! gcli volume info "$VOL" >/dev/null 2>&1; then
    mkdir -p "$ROOT/brick1" "$ROOT/brick2"
    gcli volume create "$VOL" replica 2 transport tcp \
      "$HOST:$ROOT/brick1/b" "$HOST:$ROOT/brick2/b" force >/dev/null
    if [[ $CACHE == strict ]]; then
      # Another client's rename, rewrite or append is visible at once.
      for o in performance.stat-prefetch performance.quick-read performance.open-behind \
               performance.flush-behind performance.write-behind performance.io-cache \
               performance.read-ahead; do
        gcli volume set "$VOL" "$o" off >/dev/null
      done
    fi
  fi
  if ! gcli volume status "$VOL" >/dev/null 2>&1; then
    gcli volume start "$VOL" force >/dev/null
  fi
  mount_client "$NODE_A"
  mount_client "$NODE_B"
  echo "node_a=$NODE_A"
  echo "node_b=$NODE_B"
}

down() {
  for d in "$NODE_A" "$NODE_B"; do
    if is_mounted "$d"; then umount "$d" 2>/dev/null || umount -l "$d" || true; fi
  done
  if glusterd_running; then
    gcli volume stop "$VOL" force >/dev/null 2>&1 || true
    gcli volume delete "$VOL" >/dev/null 2>&1 || true
    kill "$(cat "$PIDFILE")" 2>/dev/null || true
    for _ in $(seq 50); do glusterd_running || break; sleep 0.1; done
  fi
  # Brick processes of this volume (they outlive glusterd).
  pkill -f "glusterfsd.*--volfile-id $VOL\." 2>/dev/null || true
  pkill -f "glusterfsd -s $HOST --volfile-id $VOL" 2>/dev/null || true
  pkill -f "glustershd.*$STATE" 2>/dev/null || true
  sleep 0.2
  rm -rf "$ROOT"
}

status() {
  glusterd_running && echo "glusterd: running (pid $(cat "$PIDFILE"))" || echo "glusterd: stopped"
  for d in "$NODE_A" "$NODE_B"; do
    is_mounted "$d" && echo "$d: mounted" || echo "$d: not mounted"
  done
}

case ${1:-} in
  up) up ;;
  down) down ;;
  status) status ;;
  *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
