# Helpers shared by the benchmark scripts (sourced, not run). Every server
# they start listens on 127.0.0.1 only.

PIDS=()

# Stops every process in PIDS (SIGTERM, then SIGKILL after 5 s) and
# empties it.
stop_pids() {
  local pid i
  for pid in "${PIDS[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
  for pid in "${PIDS[@]}"; do
    for i in $(seq 50); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  PIDS=()
}

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Waits up to 10 s for something to listen on port $1.
wait_port() {
  local i
  for i in $(seq 100); do
    port_free "$1" || return 0
    sleep 0.1
  done
  echo "nothing listens on port $1 (see ${WORK:-.}/*.log)" >&2
  return 1
}

# Waits up to 10 s for port $1 to be free again.
wait_free() {
  local i
  for i in $(seq 100); do
    port_free "$1" && return 0
    sleep 0.1
  done
  echo "port $1 stays in use" >&2
  return 1
}

# Exits unless every port given is free.
require_free_ports() {
  local port
  for port in "$@"; do
    port_free "$port" || { echo "port $port is in use" >&2; exit 1; }
  done
}

# CPU ticks (user + system, in 1/100 s) of process $1 and its children
# (nginx's workers), plus any other processes given.
cpu_ticks() {
  local total=0 pid t
  for pid in "$@" $(pgrep -P "$1" || true); do
    # fields 14 and 15 of /proc/PID/stat, after the ")" that ends the name
    t=$(awk '{sub(/.*\) /, ""); print $12 + $13}' "/proc/$pid/stat")
    total=$((total + t))
  done
  echo "$total"
}

# A gateway configuration's [telemetry] section: every span exported to
# the OTLP/HTTP receiver on 127.0.0.1 port $1, as service $2.
telemetry_section() {
  printf '\n[telemetry]\nendpoint = "http://127.0.0.1:%s"\nservice_name = "%s"\n' "$1" "$2"
}
