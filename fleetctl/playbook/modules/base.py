"""What a playbook module is: a pydantic model of its arguments and a function run once per host.

Modules are thin: each calls the core that the matching command uses (release, probes, drift,
venv, kernels, ...). The runner renders the task's arguments with Jinja2, validates them with the
module's model, and calls ``fn(mc, args)`` on every host of the batch in parallel. A module
reports what it did (``changed``), what it would do in check mode (``mc.check``: change nothing,
say what would change, with a text diff when ``mc.diff``), or that it failed (``failed`` and a
one-line ``msg``). Raising ``FleetError`` is also a failure on that host; a lost connection
(``ConnectError``) makes the host unreachable.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

from fleetctl.errors import ConnectError, HostError
from fleetctl.playbook.interact import Operator
from fleetctl.vault import Vault

if TYPE_CHECKING:
    from fleetctl.inventory import Inventory
    from fleetctl.release.ownership import RunClaims
    from fleetctl.transport.fleet import HostContext, RunSettings


class Args(BaseModel):
    """Base of every module's argument model: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


@dataclass
class TaskResult:
    """One task on one host. ``data`` is what ``register`` exposes besides changed/failed/msg."""

    changed: bool = False
    failed: bool = False
    skipped: bool = False
    msg: str = ""
    diff: str = ""
    data: dict[str, Any] = field(default_factory=dict)
    rolled_back: bool = False  # the host went back to its previous release (a gate failed)
    release: str | None = None  # the release id now current on the host, when the module changed it
    set_vars: dict[str, Any] = field(default_factory=dict)  # host variables the module sets (facts)

    def as_var(self) -> dict[str, Any]:
        return {**self.data, "changed": self.changed, "failed": self.failed, "skipped": self.skipped,
                "msg": self.msg, "rolled_back": self.rolled_back}


class RunServices:
    """What every module may use besides its own host: other hosts' sessions (a golden host, an
    overlay source), the deploy lock's holder, the template renderer, a per-run memo."""

    def __init__(self, inventory: Inventory, settings: RunSettings, holder: dict[str, Any],
                 render: Callable[[str, dict[str, Any]], str], evaluate: Callable[[str, dict[str, Any]], Any],
                 sessions: dict[str, HostContext], vault: Vault | None = None) -> None:
        self.inventory = inventory
        self.vault = vault or Vault()  # decrypts vault-encrypted copy sources
        self.settings = settings
        self.holder = holder
        self.render = render  # render(template_text, vars) -> str, Jinja2 with StrictUndefined
        self.evaluate = evaluate  # evaluate("x.rc == 0", vars) -> value of a Jinja2 expression
        self._sessions = sessions
        self._as: dict[tuple[str, bool | None, str | None], HostContext] = {}  # sessions of a become keyword
        self._lock = threading.Lock()
        self.memo: dict[Any, Any] = {}
        self.memo_lock = threading.Lock()
        self.operator = Operator()  # the terminal (pause's prompt) and the run's stop, set by the runner
        self.abort = threading.Event()  # the run's second Ctrl-C: every session's gates in flight end
        self.claims: RunClaims | None = None  # the hosts a real run owns (release/ownership.py), set by the runner

    def session(self, name: str) -> HostContext:
        """The run's session of any inventory host (opened once, shared with the plays)."""
        from fleetctl.errors import InputError
        from fleetctl.transport.fleet import HostContext, make_connector

        with self._lock:
            if name not in self._sessions:
                host = self.inventory.hosts.get(name)
                if host is None:
                    raise InputError(f"host {name!r} is not in the inventory")
                self._sessions[name] = HostContext(host, make_connector(self.inventory, host, self.settings),
                                                   self.settings)
                self._sessions[name].aborting = self.abort.is_set
            return self._sessions[name]

    def session_as(self, name: str, become: bool | None, become_user: str | None) -> HostContext:
        """The host's session under a play's or task's ``become`` keyword: a connection of its own
        (the agent starts under sudo or not), opened once per run; its vars are the host's."""
        from dataclasses import replace

        from fleetctl.transport.fleet import HostContext, make_connector

        base = self.session(name)
        if become is None and become_user is None:
            return base
        settings = replace(self.settings, become=become, become_user=become_user)
        with self._lock:
            key = (name, become, become_user)
            if key not in self._as:
                host = self.inventory.hosts[name]
                self._as[key] = HostContext(host, make_connector(self.inventory, host, settings), settings)
                self._as[key].aborting = self.abort.is_set
            view = self._as[key]
        view.vars = base.vars
        view.peers = base.peers  # the batch's baseline hosts (a live canary), set on the plain session
        view.node_sync = base.node_sync  # a release/service task's groups in step (playbook/groupstep.py)
        return view

    def close(self) -> None:
        """Close the keyword sessions (the plain ones belong to the run's fleet)."""
        for ctx in self._as.values():
            try:
                ctx.close()
            except Exception:  # best effort, as Fleet.close
                pass


@dataclass
class ModuleContext:
    session: HostContext
    vars: dict[str, Any]  # the host's variables as templates see them (read-only)
    check: bool
    diff: bool
    base_dir: Path  # the playbook's folder: relative paths in arguments resolve against it
    run: RunServices
    environment: dict[str, str] = field(default_factory=dict)  # the task's `environment` (commands get it)
    role_dir: Path | None = None  # a role's task: its folder

    @property
    def host(self) -> str:
        return self.session.name

    def path(self, value: str, sub: str = "files") -> Path:
        """A controller path: absolute, else the first that exists of the role's ``sub/`` and folder,
        the playbook's ``sub/`` and folder (Ansible's search); else the playbook's folder."""
        p = Path(value).expanduser()
        if p.is_absolute():
            return p
        bases = [self.role_dir] if self.role_dir else []
        for base in [*bases, self.base_dir]:
            for candidate in (base / sub / p, base / p):
                if candidate.exists():
                    return candidate
        return self.base_dir / p


A = TypeVar("A", bound=Args)
T = TypeVar("T")
ModuleFn = Callable[[ModuleContext, Any], TaskResult]


@dataclass(frozen=True)
class Module:
    name: str
    args: type[Args]
    fn: ModuleFn
    free_form: str | None = None  # the argument a bare string sets: ``shell: "uptime"`` -> cmd
    doc: str = ""
    run_once: bool = False  # always once per batch (``pause``: one wait, not one per host)


MODULES: dict[str, Module] = {}


def module(name: str, args: type[A], free_form: str | None = None,
           run_once: bool = False) -> Callable[[Callable[[ModuleContext, A], TaskResult]], Any]:
    """Register ``fn`` as the module ``name`` (its docstring is the module's help)."""

    def register(fn: Callable[[ModuleContext, A], TaskResult]) -> Callable[[ModuleContext, A], TaskResult]:
        MODULES[name] = Module(name, args, fn, free_form, (fn.__doc__ or "").strip(), run_once)
        return fn

    return register


# --- helpers the modules share ----------------------------------------------------------------

def key_error(model: str, key: str, message: str, value: Any = None) -> ValidationError:
    """A validation error located at ``key`` (raised from a model validator): the runner's schema
    check then names that key and its line, not just the task."""
    detail = InitErrorDetails(type=PydanticCustomError("value_error", message), loc=(key,), input=value)
    return ValidationError.from_exception_data(model, [detail])


class Once:
    """A value computed once per run by whichever host asks first; the others wait for it. Errors
    are kept too, so a baseline host that is down is asked once, not once per host."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.done = False
        self.value: Any = None
        self.error: BaseException | None = None

    def get(self, compute: Callable[[], Any]) -> Any:
        with self.lock:
            if not self.done:
                try:
                    self.value = compute()
                except Exception as exc:
                    self.error = exc
                self.done = True
        if self.error is not None:
            raise self.error
        return self.value


def once(run: RunServices, key: Hashable, compute: Callable[[], T]) -> T:
    """``compute()`` once per run and key. Only the lookup holds the run's memo lock: a slow
    computation (a remote call) blocks only the hosts waiting for that same key."""
    with run.memo_lock:
        entry = run.memo.setdefault(("playbook-once", key), Once())
    value: T = entry.get(compute)
    return value


@contextmanager
def other_host_errors(mc: ModuleContext, role: str) -> Iterator[None]:
    """Work that touches another host (a baseline, an overlay source): when that host cannot be
    reached, this host fails naming it; it is not marked unreachable itself."""
    try:
        yield
    except ConnectError as exc:
        if exc.host == mc.host:
            raise
        raise HostError(mc.host, f"{role} {exc.host} is unreachable: {exc.reason}") from None


def on_other_host(mc: ModuleContext, role: str, key: Hashable, compute: Callable[[], T]) -> T:
    """``once(compute)`` for work on another host, its unreachability this host's plain failure."""
    with other_host_errors(mc, role):
        return once(mc.run, key, compute)
