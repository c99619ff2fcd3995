#!/usr/bin/env bash
# The main job on the lab fleet, end to end. Each step prints what a user would look at.
set -uo pipefail
cd "$(dirname "$0")/.."
F=.venv/bin/fleetctl
step() { printf '\n\033[1m== %s\033[0m\n$ %s\n' "$1" "${*:2}"; "${@:2}"; rc=$?; [ $rc -le 2 ] || exit $rc; }

step "Start a lab fleet of 4 real sshd hosts" $F lab up --hosts 4 --dir .fleetctl/lab || exit 1
INV=.fleetctl/lab/inventory.yml
step "The inventory, as fleetctl reads it" $F -i $INV hosts
step "Reach every host (one SSH connection + one agent per host)" $F -i $INV ping
step "Facts: OS, CPUs, memory, disks, Pythons, GPUs" $F -i $INV facts
step "An ad-hoc command; identical outputs gathered" $F -i $INV shell 'uname -sr; python3 --version'
step "Hosts whose output differs are shown apart" $F -i $INV shell 'hostname'
printf '\nThe lab stays up for you to try: fleetctl -i %s ...   (make lab-down stops it)\n' "$INV"
