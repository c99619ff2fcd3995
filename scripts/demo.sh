#!/usr/bin/env bash
# The main job on a lab fleet of 4 real sshd hosts, end to end, driven by the playbooks in
# playbooks/: provision from the real sglang wheels, audit, roll the DDTree release out
# canary-first, audit again, roll back.
set -uo pipefail
cd "$(dirname "$0")/.."
F=.venv/bin/fleetctl
DEMO=.fleetctl/demo
mkdir -p "$DEMO/wheelhouse"

say() { printf '\n\033[1m== %s\033[0m\n' "$1"; }
# Run a step; exit codes 1 (bad answer) and 2 (some host failed) are part of the story.
step() { say "$1"; shift; printf '$ fleetctl %s\n' "${*:2}"; "$@"; rc=$?; [ $rc -le 2 ] || exit $rc; }

say "Start a lab fleet of 4 real sshd hosts (each in its own namespaces, 127.0.1.1-4)"
$F lab down --purge >/dev/null 2>&1  # the demo's lab starts fresh every time
$F lab up --hosts 4 | tee "$DEMO/lab.txt" || exit 1
INV=$(tail -n 1 "$DEMO/lab.txt")
f() { $F -i "$INV" "$@"; }

say "Fetch the real sglang wheels from PyPI once (cached in .cache/wheels)"
for v in 0.5.23 0.5.9; do
  ls .cache/wheels/sglang-$v-*.whl >/dev/null 2>&1 || .venv/bin/python -m pip download -q --no-deps \
    --only-binary=:all: -d .cache/wheels "sglang==$v" || exit 1
  cp -u .cache/wheels/sglang-$v-*.whl "$DEMO/wheelhouse/"
  echo "sglang==$v" > "$DEMO/sglang-$v.lock"
done
ls -1 "$DEMO/wheelhouse"

P=playbooks
step "Provision (playbook): GPU baseline from facts, then the base venv exactly from a lock, offline" \
  f -l 'lab:!lab4' run $P/provision.yml -e target=lab -e venv=/root/ml-env -e base_lock="$PWD/$DEMO/sglang-0.5.23.lock" \
    -e wheelhouse="$PWD/$DEMO/wheelhouse"
step "lab4 is an older host: provisioned with sglang 0.5.9" \
  f -l lab4 run $P/provision.yml -e target=lab -e venv=/root/ml-env -e base_lock="$PWD/$DEMO/sglang-0.5.9.lock" \
    -e wheelhouse="$PWD/$DEMO/wheelhouse"
step "Drift audit: lab4 stands out (venvs installed with --no-deps: unsatisfied requirements skipped)" \
  f drift --venv /root/ml-env --skip unsatisfied
step "Probe: where is SpeculativeAlgorithm.DFLASH defined? (not on lab4's older sglang)" \
  f probe symbol SpeculativeAlgorithm.DFLASH --venv /root/ml-env --expect present
step "Bring lab4 level: overlay sglang from lab1's venv the way an installer would" \
  f -l lab1,lab4 venv overlay --from lab1 --venv /root/ml-env
step "Drift again: no difference left" f drift --venv /root/ml-env --skip unsatisfied --verify-files

say "Kept connections (--persist, like ControlPersist): the same search twice; the second skips connecting (and each host's grep cache answers for its unchanged files)"
export FLEETCTL_MUX_DIR="$PWD/$DEMO/mux"
TIMEFORMAT='   took %R s'
for run in "connects, then keeps the connections" "over the kept connections"; do
  printf '$ fleetctl --persist 60 probe grep DDTree DFLASH --package sglang --subpath srt   # %s\n' "$run"
  time f --persist 60 probe grep DDTree DFLASH --package sglang --subpath srt --venv /root/ml-env >/dev/null
done
step "What is kept" f connections list
step "Close them now (they also close after 60 s idle)" f connections stop

R=playbooks/releases
step "The release every host runs today (the one a rollback returns to)" f -l all deploy -y $R/sglang-0.5.23-lab.yml

say "The SGLang Model Gateway in front of the 4 servers (smg, installed from PyPI by make deps)"
SMG=${FLEETCTL_SMG:-/var/cache/fleetctl-tools/smg-1.13.0/bin/smg}
port() { .venv/bin/python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
GW="http://127.0.0.1:$(port)"
GWINV="$(dirname "$INV")/gateway.yml"  # beside the lab's inventory: its key paths and run journals stay
WORKERS=$(.venv/bin/python scripts/demo_gateway.py inventory "$INV" "$GW" "$GWINV") || exit 1
# shellcheck disable=SC2086  # one argument per worker URL
"$SMG" launch --host 127.0.0.1 --port "${GW##*:}" --policy round_robin --prometheus-host 127.0.0.1 --prometheus-port "$(port)" \
  --log-level warn --worker-urls $WORKERS >"$DEMO/smg.log" 2>&1 &
SMG_PID=$!
trap 'kill "$SMG_PID" 2>/dev/null' EXIT  # the gateway lives as long as the demo
printf '$ smg launch --port %s --policy round_robin --worker-urls %s\n' "${GW##*:}" "$WORKERS"
printf 'from here on the inventory sets router_url: %s for group lab (%s)\n' "$GW" "$GWINV"
f() { $F -i "$GWINV" "$@"; }
for _ in $(seq 150); do f router status >/dev/null 2>&1 && break; sleep 0.2; done  # registered and healthy
step "Every server is a healthy worker of the gateway" f router status
DEPLOY=(run $P/deploy-ddtree.yml -e target=lab -e release_spec=releases/ddtree-sglang-0.5.23-lab.yml)
step "Plan the DDTree rollout: patches applied in memory to each host's own files, nothing written; each host's gateway steps" \
  f "${DEPLOY[@]}" --check
say "Streaming requests through the gateway for as long as the rollout runs (2 clients, 20 tokens each)"
.venv/bin/python scripts/demo_gateway.py load "$GW" /models/Qwen3.6-35B-A3B >"$DEMO/load.txt" 2>&1 &
LOAD_PID=$!
step "Roll out DDTree canary-first: lab1, then 50%, then the rest; each host out of the gateway, drained, changed, back in; any failure rolls every host back" \
  f "${DEPLOY[@]}"
kill -INT "$LOAD_PID"; wait "$LOAD_PID"; load_rc=$?
cat "$DEMO/load.txt"
[ $load_rc -eq 0 ] || exit 4  # a request lost behind the gateway is a broken demo
step "Back in the gateway, every one" f router status
step "Audit (playbook, read-only): facts, drift against the golden host, probes of the running release" \
  f run $P/audit.yml -e target=lab -e golden_host=lab1
step "Roll back in one step per host: switch + restart, nothing reinstalled" \
  f run $P/rollback.yml -e target=lab
step "Status: current and previous release, service and health per host" f status

say "Production's login: lab4 as an operator defines it in ssh_config (alias, user fleetop), with sudo"
LAB=$(dirname "$INV")
printf 'Host gpu-lab4\n  HostName 127.0.1.4\n  User fleetop\n  IdentityFile %s\n' "$LAB/id_ed25519" > "$DEMO/ssh_config"
printf 'all:\n  hosts:\n    gpu-lab4:\n      service_host: 127.0.1.4\n' > "$DEMO/fleetop.yml"
cp "$LAB/known_hosts" "$DEMO/known_hosts"
export FLEETCTL_SSH_CONFIG="$PWD/$DEMO/ssh_config"
printf '$ cat %s\n' "$DEMO/ssh_config"; cat "$DEMO/ssh_config"
g() { $F -i "$DEMO/fleetop.yml" "$@"; }
step "Without --become fleetop may read but not change: refused before anything is written" \
  g -l all deploy -y $R/ddtree-sglang-0.5.23-lab.yml
step "With --become the agent starts under sudo: deploy" g -b -l all deploy -y $R/ddtree-sglang-0.5.23-lab.yml
step "Who ran it: the login user, and the user sudo gave" g -b -l all shell -y 'echo "login $SUDO_USER, running as $(id -un)"'
step "One-step rollback, as fleetop with sudo" g -b -l all rollback -y
step "Status through the alias" g status
unset FLEETCTL_SSH_CONFIG
say "Per-host launch args: one spec, lab1 an H200 pair (two TP4 servers), lab2 and lab3 one TP8 server"
SIZED="$(dirname "$INV")/sized.yml"  # beside the lab's inventory: its key paths stay valid
.venv/bin/python - "$GWINV" "$SIZED" <<'PY'
import sys, yaml
doc = yaml.safe_load(open(sys.argv[1]))
sizes = {"lab1": 4, "lab2": 8, "lab3": 8}
for name, entry in doc["all"]["children"]["lab"]["hosts"].items():
    entry["tp_size"] = sizes.get(name, 8)
yaml.safe_dump(doc, open(sys.argv[2], "w"), sort_keys=False)
PY
cat > "$DEMO/pair.yml" <<'YML'
name: pair
version: "1"
base: {adopt: /root/ml-env}
requires: {sglang: "==0.5.23"}
service:
  standin: true
  args: [--speculative-algorithm, DFLASH, --tp, "{{ tp_size }}"]
  instances:
    - {name: tp4-a, gpus: "0,1,2,3", port: 30001}
    - {name: tp4-b, gpus: "4,5,6,7", port: 30002}
health: {timeout: 60, interval: 0.2}
YML
s() { $F -i "$SIZED" "$@"; }
printf '$ cat %s\n' "$DEMO/pair.yml"; cat "$DEMO/pair.yml"
step "The rendered commands differ per host (--tp from each host's tp_size), the release id does not" \
  s -l lab1,lab2 deploy "$DEMO/pair.yml" --check --diff
step "Two servers on lab1, each its own supervised unit, restarted and gated in order" \
  s -l lab1 deploy -y "$DEMO/pair.yml"
step "Status shows each server" s -l lab1 status
step "Each server's log (fleetctl logs [INSTANCE])" s -l lab1 logs -n 2
sed -i 's/tp_size: 4/tp_size: 2/' "$SIZED"  # day 2: lab1's tp_size changed in the inventory
step "Day-2: an inventory change (lab1 tp_size 4 -> 2) is a reconfiguration of the serving release, not a new one" \
  s -l lab1 deploy "$DEMO/pair.yml" --check --diff
step "Applied: rewritten, restarted and gated in place (a failure would restore the configuration that served)" \
  s -l lab1 deploy -y "$DEMO/pair.yml"
step "Day-2: restart the fleet's servers one host at a time, stopping at the first failure" \
  s -l 'lab:!lab4' service restart -y --serial 1
step "Every run is journaled beside the inventory" f runs list
step "The fleet at a glance: release, service, drift, GPU health, gateway and the last run per host, one page" \
  f report --venv /root/ml-env --skip unsatisfied --output "$DEMO/fleet.html"
printf 'fleet report: %s\n' "$PWD/$DEMO/fleet.html"
printf '\nThe lab stays up for you to try: fleetctl -i %s ...   (fleetctl lab down stops it)\n' "$INV"
