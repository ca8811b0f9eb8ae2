#!/usr/bin/env bash
# A private Docker engine for machines that have none running (a CI box with only the docker
# client, a sandbox without systemd): dockerd from the distribution's package (Debian/Ubuntu:
# apt-get install docker.io), run as root with its own state directory and socket.
#
#   bash scripts/docker_engine.sh start [DIR]   start it (or find it running); prints the
#                                               `export DOCKER_HOST=...` line to use it
#   bash scripts/docker_engine.sh stop [DIR]    stop it (its images stay in DIR)
#   bash scripts/docker_engine.sh purge [DIR]   stop it and delete DIR (images, containers, cache)
#
# DIR defaults to $DOCKER_ENGINE_DIR or ~/.cache/reward_server/docker-engine; it holds every
# image layer, so it needs room (the CPU image is ~7 GB). The engine has no bridge network and
# leaves the firewall alone: run containers with `--network host` and build with
# `--network host` (scripts/docker_build.sh does). dockerd picks its storage driver (overlay2
# where the kernel allows, vfs otherwise: vfs copies every layer whole, several times the space);
# DOCKER_STORAGE_DRIVER overrides.
set -euo pipefail

cmd=${1:-}
dir=${2:-${DOCKER_ENGINE_DIR:-$HOME/.cache/reward_server/docker-engine}}
case "$cmd" in start|stop|purge) ;; -h|--help) sed -n "2,17p" "$0"; exit 0 ;; *) sed -n "2,17p" "$0" >&2; exit 2 ;; esac
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
# unix socket paths are short (108 bytes): the socket and dockerd's run state live in a short
# directory named after DIR
run="${TMPDIR:-/tmp}/vlm-reward-docker.$(printf '%s' "$dir" | cksum | cut -d' ' -f1)"
sock="$run/docker.sock"
pidfile="$run/dockerd.pid"
log() { echo "[docker_engine] $*" >&2; }

alive() { [ -S "$sock" ] && DOCKER_HOST="unix://$sock" docker version >/dev/null 2>&1; }

stop() {
  [ -f "$pidfile" ] || return 0
  pid=$(cat "$pidfile")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid"
    for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    if kill -0 "$pid" 2>/dev/null; then
      log "dockerd $pid did not stop in 30 s: killing it"
      kill -9 "$pid" 2>/dev/null || true
    fi
  fi
  rm -f "$pidfile"
}

case "$cmd" in
  start)
    if ! alive; then
      command -v dockerd >/dev/null || { log "dockerd not found: install the engine (Debian/Ubuntu: apt-get install docker.io)"; exit 1; }
      [ "$(id -u)" = 0 ] || { log "dockerd must run as root"; exit 1; }
      mkdir -p "$run" "$dir/data"
      driver=()
      [ -n "${DOCKER_STORAGE_DRIVER:-}" ] && driver=(--storage-driver "$DOCKER_STORAGE_DRIVER")
      log "starting dockerd (state in $dir, socket $sock)"
      nohup dockerd "${driver[@]}" --iptables=false --ip6tables=false --bridge=none \
        --data-root "$dir/data" --exec-root "$run/exec" --pidfile "$pidfile" -H "unix://$sock" \
        >"$dir/dockerd.log" 2>&1 </dev/null &
      for _ in $(seq 120); do alive && break; sleep 0.5; done
      alive || { log "dockerd did not come up in 60 s; its log: $dir/dockerd.log"; tail -20 "$dir/dockerd.log" >&2; exit 1; }
      log "running: storage driver $(DOCKER_HOST="unix://$sock" docker info --format '{{.Driver}}')"
    fi
    echo "export DOCKER_HOST=unix://$sock"
    ;;
  stop)
    stop
    ;;
  purge)
    stop
    # dockerd leaves its mounts behind if it was killed; they must go before the files can
    grep -F " $dir/data/" /proc/mounts | cut -d' ' -f2 | sort -r | xargs -r -n1 umount -l 2>/dev/null || true
    grep -F " $run/" /proc/mounts | cut -d' ' -f2 | sort -r | xargs -r -n1 umount -l 2>/dev/null || true
    rm -rf "$dir" "$run"
    ;;
esac
