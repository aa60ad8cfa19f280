#!/usr/bin/env bash
# Start a Docker engine for cpmatrix's docker runner, unless one already answers.
#
# Example:
#     sudo docker/start-dockerd.sh && docker version
#
# The flags follow what works on the project's CI machines (shared/FACTS.md): no iptables
# and no bridge (containers run with --network=none anyway, and the machines may not allow
# netfilter changes), overlay2 storage (vfs copies the whole 1.5 GB image on every
# container start: ~23 s instead of ~2 s).
set -euo pipefail

log=${DOCKERD_LOG:-/var/log/dockerd.log}
wait_s=${DOCKERD_WAIT_S:-60}

answers() { timeout 5 docker version >/dev/null 2>&1; }

if answers; then
    echo "start-dockerd: engine already answers"
    exit 0
fi

if ! command -v dockerd >/dev/null; then
    echo "start-dockerd: dockerd missing; installing Debian's docker.io" >&2
    if [[ $(id -u) -ne 0 ]]; then
        echo "start-dockerd: need root to install docker.io (apt-get install -y docker.io)" >&2
        exit 1
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io >/dev/null
fi

if [[ $(id -u) -ne 0 ]]; then
    echo "start-dockerd: dockerd needs root; run this script as root" >&2
    exit 1
fi

# A dockerd that was killed (a CI run ends every process a session left) leaves its pid
# file, and dockerd refuses to start while that pid exists, even as a zombie or another
# program. Remove pid files whose process is not a live dockerd/containerd.
stale_pidfile() {
    local file=$1 name=$2 pid state comm
    [[ -f $file ]] || return 1
    pid=$(<"$file")
    [[ $pid =~ ^[0-9]+$ ]] || return 0
    [[ -r /proc/$pid/stat ]] || return 0
    comm=$(<"/proc/$pid/comm")
    state=$(awk '{print $3}' "/proc/$pid/stat")
    [[ $comm != "$name" || $state == Z ]]
}
for entry in /var/run/docker.pid:dockerd /var/run/docker/containerd/containerd.pid:containerd; do
    file=${entry%%:*}
    if stale_pidfile "$file" "${entry##*:}"; then
        echo "start-dockerd: removing stale $file"
        rm -f "$file"
    fi
done

if [[ -f /var/run/docker.pid ]]; then
    # A live dockerd that does not answer yet (still starting): wait for it, start none.
    pid=$(</var/run/docker.pid)
    echo "start-dockerd: dockerd (pid $pid) runs but does not answer yet; waiting"
else
    # setsid + nohup: the engine must outlive this script and the shell that ran it, and
    # must not be in the caller's process group (a supervisor killing its group).
    setsid nohup dockerd --iptables=false --ip6tables=false --bridge=none \
        --storage-driver=overlay2 >"$log" 2>&1 </dev/null &
    pid=$!
fi

start=$SECONDS
until answers; do
    if ! kill -0 "$pid" 2>/dev/null; then
        echo "start-dockerd: dockerd exited; last lines of $log:" >&2
        tail -n 20 "$log" >&2
        exit 1
    fi
    if (( SECONDS - start >= wait_s )); then
        echo "start-dockerd: engine did not answer within ${wait_s}s; see $log" >&2
        exit 1
    fi
    sleep 0.5
done
echo "start-dockerd: engine answers after $((SECONDS - start))s (pid $pid, log $log)"
