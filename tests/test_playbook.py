"""Playbooks without hosts: the schema (the malformed ones are in tests/fixtures/malformed/playbook,
run by test_reliability_malformed.py), rollout batches and budgets, templating, and the journal
(redaction, what --resume skips)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetctl import templating
from fleetctl.errors import InputError
from fleetctl.playbook.plays import load_playbook
from fleetctl.runs import journal, rollout
from fleetctl.secrets import Redactor

REPO = Path(__file__).resolve().parent.parent

@pytest.mark.parametrize("name", ["provision.yml", "deploy-ddtree.yml", "rollback.yml", "audit.yml"])
def test_the_repo_playbooks_load(name: str) -> None:
    book = load_playbook(REPO / "playbooks" / name)
    assert book.plays and all(play.tasks for play in book.plays)


def test_deploy_ddtree_stages_everywhere_then_is_canary_first_with_rollback_all() -> None:
    stage, play = load_playbook(REPO / "playbooks" / "deploy-ddtree.yml").plays
    # every host at once, any failure stops the run before the rollout play
    assert stage.model.serial is None and stage.model.max_fail_percentage == 0
    assert [t.module.name for t in stage.tasks] == ["gpu_health", "release"]
    assert stage.tasks[1].args["state"] == "staged"
    assert play.model.serial == [1, "50%", "100%"]
    assert play.model.on_failure == "rollback_all"
    # GPU health first: a red host fails before the release task and never gets the release
    assert [t.module.name for t in play.tasks] == ["gpu_health", "release", "probe", "wait_http"]
    hosts = [f"h{i}" for i in range(1, 9)]
    assert rollout.batches(hosts, play.model.serial) == [["h1"], hosts[1:5], hosts[5:]]


def test_provision_and_audit_check_gpu_health() -> None:
    for name in ("provision.yml", "audit.yml"):
        tasks = load_playbook(REPO / "playbooks" / name).plays[0].tasks
        assert "gpu_health" in [t.module.name for t in tasks], name
    audit = {t.module.name: t for t in load_playbook(REPO / "playbooks" / "audit.yml").plays[0].tasks}
    assert audit["gpu_health"].options.ignore_errors and audit["gpu_health"].options.register_as == "gpu_result"


def test_free_form_and_options(tmp_path: Path) -> None:
    path = tmp_path / "p.yml"
    path.write_text("- hosts: all\n  tasks:\n    - shell: uptime\n      register: up\n      tags: smoke\n"
                    "      retries: 2\n      delay: 0\n      until: up.rc == 0\n")
    task = load_playbook(path).plays[0].tasks[0]
    assert task.args == {"cmd": "uptime"}
    assert task.options.register_as == "up" and task.options.tags == ["smoke"]
    assert task.name == "shell uptime"


def test_templated_arguments_are_checked_once_rendered(tmp_path: Path) -> None:
    path = tmp_path / "p.yml"
    path.write_text("- hosts: all\n  tasks:\n    - wait_http:\n        path: /health\n        timeout: '{{ t }}'\n")
    assert load_playbook(path).plays[0].tasks[0].args["timeout"] == "{{ t }}"  # not refused at load


@pytest.mark.parametrize(("hosts", "serial", "sizes"), [
    (4, None, [4]),
    (4, [1], [1, 1, 1, 1]),
    (4, [1, "50%", "100%"], [1, 2, 1]),
    (10, [1, "25%", "100%"], [1, 2, 7]),
    (3, ["30%"], [1, 1, 1]),  # rounded down, at least one host
    (5, [2], [2, 2, 1]),
    (0, [1], []),
])
def test_batches(hosts: int, serial: list[int | str] | None, sizes: list[int]) -> None:
    names = [f"h{i}" for i in range(hosts)]
    got = rollout.batches(names, serial)
    assert [len(b) for b in got] == sizes
    assert [h for b in got for h in b] == names


def test_budgets() -> None:
    assert rollout.Budget().exceeded(0, 3, 0) is None
    assert rollout.Budget().exceeded(1, 3, 1) is None  # no budget: the others go on
    assert "every host of the batch failed" in str(rollout.Budget().exceeded(1, 1, 1))
    assert rollout.Budget(max_fail_percentage=50).exceeded(1, 2, 1) is None  # 50% is not above 50%
    assert "max_fail_percentage" in str(rollout.Budget(max_fail_percentage=50).exceeded(2, 3, 2))
    assert rollout.Budget(max_failures=1).exceeded(1, 3, 1) is None
    assert rollout.Budget(max_failures=1).exceeded(1, 1, 1) is None  # an explicit budget: a 1-host batch may fail
    assert "max_failures 1 exceeded: 2" in str(rollout.Budget(max_failures=1).exceeded(1, 3, 2))
    assert "any_errors_fatal" in str(rollout.Budget(any_errors_fatal=True).exceeded(1, 4, 1))


def test_templating_keeps_types_and_is_strict() -> None:
    assert templating.render("{{ ports }}", {"ports": [1, 2]}) == [1, 2]
    assert templating.render({"a": ["x{{ n }}"]}, {"n": 3}) == {"a": ["x3"]}
    assert templating.render("echo {{ v | quote }}", {"v": "a; touch /tmp/x"}) == "echo 'a; touch /tmp/x'"
    with pytest.raises(templating.TemplateProblem, match="'nope' is undefined"):
        templating.render("{{ nope }}", {})
    with pytest.raises(templating.TemplateProblem, match="has no attribute 'rc'"):
        templating.evaluate("r.rc == 0", {"r": {}})
    assert templating.evaluate("'580.1' is version('550', '>=')", {}) is True
    assert templating.evaluate("r is failed", {"r": {"failed": True}}) is True
    assert templating.evaluate("'NVIDIA H200' is search('H200')", {}) is True
    assert templating.render("{{ x | default(none) }}", {}) is None
    # numbers and lists still come out native, but a string is the text made: quotes kept (Jinja's own
    # native concat literal_evals it: `'a'"b"` became `ab`, found by the hostile-input lab test)
    assert templating.render("{{ n }}", {"n": "2"}) == 2 and templating.render("[{{ n }}]", {"n": 1}) == [1]
    assert templating.render("{{ a }}{{ b }}", {"a": "'; x; '", "b": '"; y; "'}) == "'; x; '\"; y; \""
    assert templating.render("{{ a }}", {"a": "'quoted'"}) == "'quoted'"
    assert templating.render("'{{ a }}'", {"a": "x"}) == "'x'"
    # whole files stay text: a JSON template is not turned into a Python repr
    assert templating.render_text('{"port": {{ port }}}\n', {"port": 30000}) == '{"port": 30000}\n'


def test_redactor_masks_secret_values_everywhere() -> None:
    red = Redactor.for_hosts([{"secret_vars": ["HF_TOKEN"], "HF_TOKEN": "hf_abcdef123"}, {"x": 1}])
    doc = {"msg": "token hf_abcdef123 used", "data": {"stdout": ["hf_abcdef123\n"]}, "n": 3}
    assert red(doc) == {"msg": "token ******** used", "data": {"stdout": ["********\n"]}, "n": 3}


def test_journal_finished_hosts_and_recorded_releases(tmp_path: Path) -> None:
    j = journal.Journal.create(tmp_path, Path("deploy.yml"), Redactor([]))
    j.event("run_start", playbook="deploy.yml")
    j.event("recorded", play=0, releases={"a": "r1", "b": None})
    for host in ("a", "b"):
        j.event("host_done", play=0, host=host, status="ok")
    j.event("rollback", play=0, host="b", status="rolled-back")
    j.event("host_done", play=0, host="c", status="failed")
    j.close()
    with j.path.open("a") as f:
        f.write('{"event": "task_res')  # a controller killed mid-write
    events = journal.read_events(j.path)
    assert journal.finished_hosts(events) == {0: {"a"}}
    assert journal.recorded_releases(events) == {0: {"a": "r1", "b": None}}
    summary = journal.summarize(j.path)
    assert summary.status == "incomplete" and summary.hosts == ["a", "b", "c"]
    assert journal.find_run(tmp_path, j.run_id) == j.path
    with pytest.raises(InputError, match="not a run id"):
        journal.find_run(tmp_path, "../../etc/passwd")
