#!/usr/bin/env bash
# The main job on a lab fleet of 4 real sshd hosts, end to end: provision venvs from the real
# sglang wheels, audit, deploy the DDTree release canary-first, probe, audit again, roll back.
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

step "Provision: a venv from a lock file, installed offline from the wheelhouse" \
  f -l 'lab:!lab4' venv create --venv /root/ml-env --lock "$DEMO/sglang-0.5.23.lock" --wheelhouse "$DEMO/wheelhouse"
step "lab4 is an older host: it still runs sglang 0.5.9" \
  f -l lab4 venv create --venv /root/ml-env --lock "$DEMO/sglang-0.5.9.lock" --wheelhouse "$DEMO/wheelhouse"
step "Facts: OS, CPUs, memory, disks, GPUs, the venv's ML stack" f facts --venv /root/ml-env
step "Drift audit: lab4 stands out (venvs installed with --no-deps: unsatisfied requirements skipped)" \
  f drift --venv /root/ml-env --skip unsatisfied
step "Probe: where is SpeculativeAlgorithm.DFLASH defined? (not on lab4's older sglang)" \
  f probe symbol SpeculativeAlgorithm.DFLASH --venv /root/ml-env --expect present

R=playbooks/releases
step "Deploy the plain release everywhere it fits (lab4 is refused: another sglang; nothing changed there)" \
  f deploy $R/sglang-0.5.23-lab.yml
step "Bring lab4 level: overlay sglang from lab1's venv the way an installer would (plan first)" \
  f -l lab1,lab4 venv overlay --from lab1 --venv /root/ml-env
step "Drift again: no difference left" f drift --venv /root/ml-env --skip unsatisfied --verify-files
step "lab4 gets the plain release too" f -l lab4 deploy $R/sglang-0.5.23-lab.yml
step "Plan the DDTree release: patches applied in memory to each host's own files, nothing written" \
  f deploy $R/ddtree-sglang-0.5.23-lab.yml --check
step "Canary: the DDTree release on lab1 only, with health gates" \
  f -l lab1 deploy $R/ddtree-sglang-0.5.23-lab.yml
step "The rest of the fleet" f -l 'lab:!lab1' deploy $R/ddtree-sglang-0.5.23-lab.yml
step "Probe: DDTREE is defined in every running release" \
  f probe symbol SpeculativeAlgorithm.DDTREE --venv /opt/fleetctl/current/venv --expect present
step "The services answer, from the release that runs" \
  f probe http /server_info --field fleetctl_standin.release --field internal_states.0.avg_spec_accept_length
step "Drift of the running release: the patched files are reported as patched, nothing else" \
  f -l lab1 drift --venv /opt/fleetctl/current/venv --verify-files --skip unsatisfied
step "Roll back in one step: switch + restart, nothing reinstalled" f rollback
step "Status: current and previous release, service and health per host" f status
printf '\nThe lab stays up for you to try: fleetctl -i %s ...   (fleetctl lab down stops it)\n' "$INV"
