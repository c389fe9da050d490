#!/usr/bin/env bash
# Fault tests on the compose cluster (deploy/compose.yaml): three coordinators and two simulated GPU nodes, each in
# its own container, under a concurrent client workload (fault-check) while this script kills, partitions and
# restarts them for real:
#   1. docker kill of the leader (restarted after 6 s)
#   2. docker kill of a node agent (restarted after 3 s)
#   3. the leader cut off: docker network disconnect, 8 s
#   4. one follower cut off: docker network disconnect, 8 s
#   5. the leader cut from the agents only: packets between it and the sim-nodes dropped inside its network
#      namespace (iptables through nsenter; docker cannot cut one link), 8 s
#   6. a rolling restart of all three coordinators, each back and caught up before the next
#   7. a node agent restarted in the middle of a reconfiguration (right after a plan is triggered)
#   8. a node agent killed for good (past the failure detector's fail_after, 15 s): the leader marks it failed, its
#      GPUs are emptied and its tenants replanned onto the other node; then it comes back and rejoins healthy
#   9. a ghost write: a follower cut from the other coordinators by dropped packets (its TCP connections stall
#      rather than fail), an update sent through it (outcome unknown), a newer one acknowledged through the leader;
#      after the link heals, every member must still hold the newer one
# Then it waits for every node to report its committed layout, checks from each node's MIG change log that no
# instance its target kept was ever destroyed, and checks the history fault-check recorded for linearizability
# (a memoised Wing & Gong search, todc-utils) and lost acknowledged writes. The last line is
#   ops=N faults=N lost=N linearizable=yes|no max_unavailable_s=X converged=yes|no node_death=yes|no ghost_write=yes|no
# and it exits non-zero unless lost=0, linearizable=yes, converged=yes, node_death=yes and ghost_write=no.
#
# Usage: deploy/fault-test.sh [--profile release|debug] [--no-build] [--duration 150s]
#   --profile debug packages the debug binaries (faster to build; what CI uses); --no-build uses the images and
#   binaries already there. Needs docker, docker-compose (or `docker compose`), iptables and nsenter, and root.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

profile=release
build=1
duration=150s
while [ $# -gt 0 ]; do
  case "$1" in
    --profile) profile=$2; shift 2 ;;
    --no-build) build=0; shift ;;
    --duration) duration=$2; shift 2 ;;
    *) echo "fault-test: unknown argument $1" >&2; exit 2 ;;
  esac
done
case "$profile" in
  release) cargo_profile=(--release) ;;
  debug) cargo_profile=() ;;
  *) echo "fault-test: --profile release or debug" >&2; exit 2 ;;
esac

if docker compose version >/dev/null 2>&1; then
  compose=(docker compose -p tessera-fault -f deploy/compose.yaml)
else
  compose=(docker-compose -p tessera-fault -f deploy/compose.yaml)
fi
out="$root/target/fault-test"
mkdir -p "$out"

if [ "$build" = 1 ]; then
  scripts/cargo build "${cargo_profile[@]}" --locked -p tessera-fault-check -p tessera-coordinator
  deploy/build-images.sh --profile "$profile"
fi
bin="$root/target/$profile"
endpoints=127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003
# The cluster runs mutual TLS: a fresh development PKI; the containers (gid 65532) read their keys through the group.
export TESSERA_PKI="$out/pki"
rm -rf "$TESSERA_PKI"
"$bin/coordinator" certs init --out "$TESSERA_PKI" --nodes 3 --agent node-a-0 --agent node-b-0 >/dev/null
chgrp 65532 "$TESSERA_PKI"/node-*.key
chmod 0640 "$TESSERA_PKI"/node-*.key
chmod 0755 "$TESSERA_PKI"
tls=(--tls-cert "$TESSERA_PKI/admin.pem" --tls-key "$TESSERA_PKI/admin.key" --tls-ca "$TESSERA_PKI/ca.pem")
ctl() { "$bin/coordinator" "$@" --endpoints "$endpoints" "${tls[@]}"; }
log() { printf '%s fault-test: %s\n' "$(date +%T)" "$*" >&2; }

cleanup() {
  "${compose[@]}" logs --no-color >"$out/compose.log" 2>&1 || true
  "${compose[@]}" down -v --remove-orphans >/dev/null 2>&1 || true
}
trap cleanup EXIT
"${compose[@]}" down -v --remove-orphans >/dev/null 2>&1 || true
log "starting the cluster"
"${compose[@]}" up -d >/dev/null 2>&1

cid() { "${compose[@]}" ps -q "$1"; }

# Least privilege: each container mounts the CA and its own certificate and key, and no other key.
for svc in coordinator-1 coordinator-2 coordinator-3 sim-node-a sim-node-b; do
  keys=$(docker inspect -f '{{range .Mounts}}{{.Source}} {{end}}' "$(cid "$svc")" | tr ' ' '\n' | grep '\.key$' || true)
  case "$svc" in
    coordinator-*) own="node-${svc#coordinator-}.key" ;;
    sim-node-*) own="node-${svc#sim-node-}-0.key" ;;
  esac
  if [ "$(printf '%s\n' "$keys" | grep -c .)" != 1 ] || [ "$(basename "$keys")" != "$own" ]; then
    log "$svc mounts keys other than its own ($own): $keys"
    exit 1
  fi
done
network=$(docker inspect -f '{{range $k, $v := .NetworkSettings.Networks}}{{$k}}{{end}}' "$(cid coordinator-1)")
json_field() { python3 -c "import json,sys; print(json.load(sys.stdin)$1)"; }

# The leader's id, once one answers with a leader and every member is up (times out after 60 s).
wait_leader() {
  local deadline=$((SECONDS + 60)) s
  while [ $SECONDS -lt $deadline ]; do
    if s=$(ctl status --json 2>/dev/null) && [ "$(json_field "['leader_id']" <<<"$s")" != 0 ]; then
      json_field "['leader_id']" <<<"$s"
      return 0
    fi
    sleep 0.5
  done
  log "no leader within 60 s"
  return 1
}

# Waits until every coordinator answers status itself (a restarted one has rejoined).
wait_all_up() {
  local deadline=$((SECONDS + 60)) n
  while [ $SECONDS -lt $deadline ]; do
    n=0
    for p in 7001 7002 7003; do
      if "$bin/coordinator" status --json --endpoints "127.0.0.1:$p" "${tls[@]}" 2>/dev/null | grep -q '"leader_id": *[1-9]'; then
        n=$((n + 1))
      fi
    done
    [ "$n" = 3 ] && return 0
    sleep 0.5
  done
  log "not every coordinator answered within 60 s"
  return 1
}

wait_leader >/dev/null
wait_all_up
log "cluster up; starting the client workload for $duration"
"$bin/fault-check" --endpoints "$endpoints" "${tls[@]}" --duration "$duration" --history "$out/history.jsonl" \
  >"$out/check.out" 2>"$out/check.err" &
check_pid=$!
sleep 10

faults=0
fault() { faults=$((faults + 1)); log "fault $faults: $*"; }

leader=$(wait_leader)
fault "docker kill coordinator-$leader (the leader)"
docker kill "$(cid "coordinator-$leader")" >/dev/null
sleep 6
docker start "$(cid "coordinator-$leader")" >/dev/null
wait_all_up

fault "docker kill sim-node-a"
docker kill "$(cid sim-node-a)" >/dev/null
sleep 3
docker start "$(cid sim-node-a)" >/dev/null

# Cuts coordinator $1 off the network for 8 s, then reconnects it under its service name and waits for it.
cut_off() {
  docker network disconnect "$network" "$(cid "coordinator-$1")"
  sleep 8
  docker network connect --alias "coordinator-$1" "$network" "$(cid "coordinator-$1")"
  wait_all_up
}

leader=$(wait_leader)
fault "coordinator-$leader (the leader) cut off the network"
cut_off "$leader"

leader=$(wait_leader)
follower=$(( leader % 3 + 1 ))
fault "coordinator-$follower (a follower) cut off the network"
cut_off "$follower"

leader=$(wait_leader)
fault "coordinator-$leader (the leader) cut from the agents only"
pid=$(docker inspect -f '{{.State.Pid}}' "$(cid "coordinator-$leader")")
agent_ips=()
for n in sim-node-a sim-node-b; do
  agent_ips+=("$(docker inspect -f "{{(index .NetworkSettings.Networks \"$network\").IPAddress}}" "$(cid $n)")")
done
for ip in "${agent_ips[@]}"; do
  nsenter -t "$pid" -n iptables -I INPUT -s "$ip" -j DROP
  nsenter -t "$pid" -n iptables -I OUTPUT -d "$ip" -j DROP
done
sleep 8
for ip in "${agent_ips[@]}"; do
  nsenter -t "$pid" -n iptables -D INPUT -s "$ip" -j DROP
  nsenter -t "$pid" -n iptables -D OUTPUT -d "$ip" -j DROP
done

for id in 1 2 3; do
  fault "rolling restart: coordinator-$id"
  docker restart -t 5 "$(cid "coordinator-$id")" >/dev/null
  wait_all_up
done

fault "sim-node-b restarted during a reconfiguration"
ctl plan trigger >/dev/null 2>&1 &
trigger_pid=$!
sleep 0.2
docker restart -t 0 "$(cid sim-node-b)" >/dev/null
wait "$trigger_pid" || true

# Every tenant served (an inference instance applied) on node $1, one per line.
served_on() {
  ctl node list --json 2>/dev/null | python3 -c '
import json, sys
for n in json.load(sys.stdin):
    if n["id"] == sys.argv[1]:
        for g in n["gpus"]:
            for a in filter(None, g["applied_assignments"].split(", ")):
                if a.endswith(":serve"):
                    print(a.split(":")[1])' "$1" | sort -u
}
node_health() {
  ctl node list --json 2>/dev/null | python3 -c '
import json, sys
print(next((n["health"] for n in json.load(sys.stdin) if n["id"] == sys.argv[1]), "unknown"))' "$1"
}

# First a plan that gives node-a work (a window round may not have run since the last faults).
ctl plan trigger >/dev/null 2>&1 || true
deadline=$((SECONDS + 60))
while [ $SECONDS -lt $deadline ] && [ -z "$(served_on node-a-0)" ]; do sleep 0.5; done
fault "docker kill sim-node-a for good (past fail_after)"
served_on node-a-0 >"$out/served-on-a.txt"
before=$(wc -l <"$out/served-on-a.txt")
epoch_before=$(ctl status --json | json_field "['plan_epoch']")
docker kill "$(cid sim-node-a)" >/dev/null
killed=$SECONDS
t_failed=-1
while [ $((SECONDS - killed)) -lt 60 ]; do
  if [ "$(node_health node-a-0)" = failed ]; then t_failed=$((SECONDS - killed)); break; fi
  sleep 0.5
done
# The replan after the failure is committed (node-a's GPUs emptied) and node-b has applied it.
t_moved=-1
while [ "$t_failed" -ge 0 ] && [ $((SECONDS - killed)) -lt 90 ]; do
  if ctl node list --json 2>/dev/null | python3 -c '
import json, sys
epoch = int(sys.argv[1])
nodes = {n["id"]: n for n in json.load(sys.stdin)}
a, b = nodes.get("node-a-0"), nodes.get("node-b-0")
ok = bool(a and b) and all(g["target"] == "(empty)" for g in a["gpus"]) and any(
    g["target_epoch"] > epoch for g in b["gpus"]) and all(
    g["applied_epoch"] == g["target_epoch"] and g["applied"] == g["target"] for g in b["gpus"] if g["target_epoch"] > 0)
sys.exit(0 if ok else 1)' "$epoch_before"; then
    t_moved=$((SECONDS - killed)); break
  fi
  sleep 0.5
done
moved=$(served_on node-b-0 | grep -cxF -f "$out/served-on-a.txt" || true)
log "node-a dead: failed after ${t_failed} s, replan applied on node-b after ${t_moved} s; of the $before tenants node-a served, $moved are served on node-b"
node_death=yes
{ [ "$t_failed" -ge 0 ] && [ "$t_moved" -ge 0 ]; } || node_death=no
docker start "$(cid sim-node-a)" >/dev/null
back=$SECONDS
t_healthy=-1
while [ $((SECONDS - back)) -lt 60 ]; do
  if [ "$(node_health node-a-0)" = healthy ]; then t_healthy=$((SECONDS - back)); break; fi
  sleep 0.5
done
log "node-a back: healthy after ${t_healthy} s"
[ "$t_healthy" -ge 0 ] || node_death=no

leader=$(wait_leader)
follower=$(( leader % 3 + 1 ))
fault "ghost write through coordinator-$follower, cut from its peers by dropped packets"
ghost_dir=$(mktemp -d)
ghost_file() {
  printf '[[tenant]]\nid = "ghost"\nmodel = "resnet50"\nslo = "%s"\ndemand = { poisson_rps = 1.0 }\n' "$1" >"$2"
}
ghost_file 111ms "$ghost_dir/first.toml"
ghost_file 444ms "$ghost_dir/late.toml"
ghost_file 555ms "$ghost_dir/newer.toml"
ctl tenant add --file "$ghost_dir/first.toml" >/dev/null 2>&1 || ctl tenant add --update --file "$ghost_dir/first.toml" >/dev/null
pid=$(docker inspect -f '{{.State.Pid}}' "$(cid "coordinator-$follower")")
peer_ips=()
for id in 1 2 3; do
  [ "$id" = "$follower" ] && continue
  peer_ips+=("$(docker inspect -f "{{(index .NetworkSettings.Networks \"$network\").IPAddress}}" "$(cid "coordinator-$id")")")
done
for ip in "${peer_ips[@]}"; do
  nsenter -t "$pid" -n iptables -I INPUT -s "$ip" -j DROP
  nsenter -t "$pid" -n iptables -I OUTPUT -d "$ip" -j DROP
done
# The late write goes through the cut follower at once (it still believes in the leader): its outcome is unknown.
late_rc=0
"$bin/coordinator" tenant add --update --file "$ghost_dir/late.toml" --endpoints "127.0.0.1:700$follower" "${tls[@]}" \
  --timeout 2s >/dev/null 2>&1 || late_rc=$?
# A newer write through the majority is acknowledged.
ctl tenant add --update --file "$ghost_dir/newer.toml" >/dev/null
sleep 15
for ip in "${peer_ips[@]}"; do
  nsenter -t "$pid" -n iptables -D INPUT -s "$ip" -j DROP
  nsenter -t "$pid" -n iptables -D OUTPUT -d "$ip" -j DROP
done
healed=$SECONDS
wait_all_up
log "follower answering with a leader $((SECONDS - healed)) s after the heal (late write exit $late_rc)"
# Whatever a stalled connection held has had time to arrive: every member must still hold the newer write.
sleep 5
ghost=no
for p in 7001 7002 7003; do
  slo=$("$bin/coordinator" tenant get ghost --json --endpoints "127.0.0.1:$p" "${tls[@]}" | json_field "['spec']['slo_ms']")
  log "coordinator at $p: ghost slo ${slo} ms"
  [ "${slo%.*}" = 555 ] || ghost=yes
done
rm -rf "$ghost_dir"

log "faults done; waiting for the client workload"
check_rc=0
wait "$check_pid" || check_rc=$?
cat "$out/check.err" >&2
summary=$(tail -n 1 "$out/check.out")
log "fault-check: $summary (exit $check_rc)"

# Converged: every node reports its committed target as applied (same layout, same epoch) within 60 s.
converged=no
deadline=$((SECONDS + 60))
while [ $SECONDS -lt $deadline ]; do
  if ctl node list --json 2>/dev/null | python3 -c '
import json, sys
nodes = json.load(sys.stdin)
gpus = [g for n in nodes for g in n["gpus"]]
ok = len(nodes) == 2 and all(g["target_epoch"] == 0 or (g["applied_epoch"] == g["target_epoch"] and g["applied"] == g["target"]) for g in gpus)
sys.exit(0 if ok else 1)'; then
    converged=yes
    break
  fi
  sleep 1
done

# Unchanged instances were never touched: each sim-node's agent logs every instance a reconcile step created or
# destroyed with the target it worked towards; a destroyed instance that its target keeps is a violation.
touched=0
changes=0
for n in a b; do
  if docker cp "$(cid "sim-node-$n"):/data/node-$n-0/mig-changes.jsonl" "$out/mig-changes-$n.jsonl" 2>/dev/null; then
    read -r c t < <(python3 -c '
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print(sum(len(l["created"]) + len(l["destroyed"]) for l in lines), sum(len(l["kept_destroyed"]) for l in lines))' \
      "$out/mig-changes-$n.jsonl")
    changes=$((changes + c))
    touched=$((touched + t))
  else
    log "no MIG change log from sim-node-$n"
    touched=$((touched + 1))
  fi
done
log "MIG changes on the nodes: $changes; instances destroyed although their target kept them: $touched"
[ "$touched" = 0 ] || converged=no

field() { sed -n "s/.*\b$1=\([^ ]*\).*/\1/p" <<<"$summary"; }
ops=$(field ops)
lost=$(field lost)
linearizable=$(field linearizable)
max_unavailable=$(field max_unavailable_s)
echo "ops=${ops:-0} faults=$faults lost=${lost:-?} linearizable=${linearizable:-no} max_unavailable_s=${max_unavailable:-?} converged=$converged node_death=$node_death ghost_write=$ghost"
[ "${lost:-1}" = 0 ] && [ "${linearizable:-no}" = yes ] && [ "$converged" = yes ] && [ "$node_death" = yes ] \
  && [ "$ghost" = no ]
