#!/usr/bin/env bash
# The main job on the lab fleet, end to end. Each step prints what a user would look at.
set -uo pipefail
cd "$(dirname "$0")/.."
F=.venv/bin/fleetctl
step() { printf '\n\033[1m== %s\033[0m\n$ %s\n' "$1" "${*:2}"; "${@:2}"; rc=$?; [ $rc -le 2 ] || exit $rc; }

printf '\n\033[1m== Start a lab fleet of 4 real sshd hosts\033[0m\n$ fleetctl lab up --hosts 4\n'
$F lab up --hosts 4 | tee /tmp/fleetctl-demo-lab.txt || exit 1
INV=$(tail -n 1 /tmp/fleetctl-demo-lab.txt)
step "The inventory, as fleetctl reads it" $F -i $INV hosts
step "Reach every host (one SSH connection + one agent per host)" $F -i $INV ping
step "Facts: OS, CPUs, memory, disks, Pythons, GPUs" $F -i $INV facts
step "An ad-hoc command; identical outputs gathered" $F -i $INV shell 'uname -sr; python3 --version'
step "Hosts whose output differs are shown apart" $F -i $INV shell 'hostname'
printf '\nThe lab stays up for you to try: fleetctl -i %s ...   (fleetctl lab down stops it)\n' "$INV"
