"""Overlay planning (pure) and the host-side relocation helpers, without any host."""

from __future__ import annotations

import ast
import base64
import hashlib
import os
import shlex
import struct
import sys
import tempfile
import zlib
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from fleetctl.overlay import abi as abi
from fleetctl.overlay import plan as core
from fleetctl.overlay import stream as stream
from fleetctl.transport.agent import module_source

PY311 = abi.Interpreter("3.11.2", "cpython", "cpython-311-x86_64-linux-gnu", "linux-x86_64", "/v", "/v/lib/site",
                        "2.36", (".cpython-311-x86_64-linux-gnu.so", ".abi3.so", ".so"))
PY312 = abi.Interpreter("3.12.3", "cpython", "cpython-312-x86_64-linux-gnu", "linux-x86_64", "/v", "/v/lib/site",
                        "2.36", (".cpython-312-x86_64-linux-gnu.so", ".abi3.so", ".so"))
OLD_GLIBC = abi.Interpreter("3.11.2", "cpython", "cpython-311-x86_64-linux-gnu", "linux-x86_64", "/v", "/v/l", "2.17")
UNSAID = abi.Interpreter("3.11.2", "cpython", "cpython-311-x86_64-linux-gnu", "linux-x86_64", "/v", "/v/l")


def remote(module: str) -> dict[str, Any]:
    ns: dict[str, Any] = {"__name__": "fleetctl_remote_test"}
    exec(compile(module_source(module)[0], module, "exec"), ns)  # noqa: S102 - our own host-side code
    return ns


def sha(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


@pytest.mark.parametrize("module", ["relocate", "overlay_source", "overlay_target", "venv_create", "distributions"])
def test_remote_modules_are_python38(module: str) -> None:
    ast.parse(module_source(module)[0], feature_version=(3, 8))


@pytest.mark.parametrize(("tag", "fits"), [
    ("py3-none-any", True), ("py2.py3-none-any", True), ("cp311-cp311-manylinux_2_17_x86_64", True),
    ("cp38-abi3-manylinux2014_x86_64", True), ("cp312-cp312-manylinux_2_17_x86_64", False),
    ("cp311-cp311-manylinux_2_17_aarch64", False), ("cp311-cp311-macosx_11_0_x86_64", False),
    ("cp312-abi3-manylinux2014_x86_64", False), ("py312-none-any", False),
    ("cp310-abi3-manylinux2014_x86_64", True), ("cp310-cp310-manylinux2014_x86_64", False),
    ("cp311-cp311-manylinux_2_28_x86_64.manylinux_2_17_x86_64", True), ("cp311-cp311-manylinux_2_39_x86_64", False),
    ("cp311-cp311-linux_x86_64", True), ("cp311-cp311-musllinux_1_2_x86_64", False),
])
def test_wheel_tags_against_the_target_interpreter(tag: str, fits: bool) -> None:
    assert abi.tag_fits(tag, PY311) is fits


def test_manylinux_follows_the_target_glibc() -> None:
    assert abi.tag_fits("cp311-cp311-manylinux2014_x86_64", OLD_GLIBC)
    assert not abi.tag_fits("cp311-cp311-manylinux_2_28_x86_64", OLD_GLIBC)
    assert abi.tag_fits("cp311-cp311-manylinux_2_28_x86_64", UNSAID)  # no glibc fact: any manylinux of the arch
    assert not abi.tag_fits("cp311-cp311-manylinux_2_28_aarch64", UNSAID)


def test_an_abi3_wheel_carrying_a_cpython_310_file_overlays_onto_311() -> None:
    """sglang-kernel 0.4.10: a cp310-abi3 wheel with sgl_kernel/*.cpython-310-x86_64-linux-gnu.so,
    loaded by path; the source (3.11) uses it, so a 3.11 target can."""
    kernel = _dist("sglang-kernel", tags=("cp310-abi3-manylinux2014_x86_64",),
                   ext=(("cpython-310-x86_64-linux-gnu", "sgl_kernel/infllm_ops.cpython-310-x86_64-linux-gnu.so"),
                        ("abi3", "sgl_kernel/common_ops.abi3.so")))
    src = core.SourceListing("golden", PY311, {"sglang-kernel": kernel})
    assert core.refusals(src, PY311) == ()
    assert core.refusals(src, PY312) == ()  # abi3 for >= 3.10: a 3.12 target loads it too
    cp39 = replace(PY311, version="3.9.18", soabi="cpython-39-x86_64-linux-gnu", ext_suffixes=())
    (refusal,) = core.refusals(src, cp39)
    assert "WHEEL tag cp310-abi3-manylinux2014_x86_64 does not fit python 3.9.18" in refusal.line()


def _dist(name: str = "pyyaml", tags: tuple[str, ...] = (), ext: tuple[tuple[str, str], ...] = (),
          files: tuple[core.SourceFile, ...] = ()) -> core.SourceDist:
    return core.SourceDist(name, "6.0.2", f"{name}-6.0.2.dist-info", tags, ext, files)


def test_a_cp312_venv_onto_311_is_refused_with_every_reason() -> None:
    bad = _dist(tags=("cp312-cp312-manylinux_2_17_x86_64",),
                ext=(("cpython-312-x86_64-linux-gnu", "yaml/_yaml.cpython-312-x86_64-linux-gnu.so"),))
    good = _dist("idna", tags=("py3-none-any",))
    src = core.SourceListing("lab1", PY312, {"pyyaml": bad, "idna": good})
    (refusal,) = core.refusals(src, PY311)
    assert refusal.name == "pyyaml" and len(refusal.reasons) == 2
    assert "yaml/_yaml.cpython-312-x86_64-linux-gnu.so is built for cpython-312" in refusal.line()
    assert core.compat_reasons(_dist(ext=(("abi3", "x.abi3.so"),)), PY311, PY312) == []
    # No WHEEL file at all (a hand-made install): the suffixes the source imports still decide.
    untagged = _dist(ext=(("cpython-312-x86_64-linux-gnu", "yaml/_yaml.cpython-312-x86_64-linux-gnu.so"),))
    assert len(core.compat_reasons(untagged, PY311, PY312)) == 1
    assert core.compat_reasons(untagged, PY312, PY312) == []


def test_a_file_the_source_does_not_import_by_name_is_not_judged_by_it() -> None:
    """A cpython-312 file inside a 3.11 source whose WHEEL fits: the source never imports it by that
    suffix, so its name says nothing about the target."""
    odd = _dist(tags=("py3-none-any",),
                ext=(("cpython-312-x86_64-linux-gnu", "pkg/x.cpython-312-x86_64-linux-gnu.so"),))
    assert core.compat_reasons(odd, PY311, PY311) == []


@pytest.mark.parametrize(("old", "new", "action"), [
    ([], "1.0", core.Action.ADD), (["0.5.9"], "0.5.23", core.Action.UPGRADE),
    (["0.5.23"], "0.5.9", core.Action.DOWNGRADE), (["1.0"], "1.0.0", core.Action.SAME),
])
def test_classify_uses_version_order(old: list[str], new: str, action: core.Action) -> None:
    assert core.classify(old, new) is action


def test_plan_sends_only_differing_files_and_removes_what_the_new_record_drops() -> None:
    files = (core.SourceFile("pkg/a.py", "A2", 10), core.SourceFile("pkg/b.py", "B", 20),
             core.SourceFile("pkg-2.0.dist-info/RECORD", "R2", 5))
    src = core.SourceDist("pkg", "2.0", "pkg-2.0.dist-info", (), (), files)
    old = core.InstalledDist("1.0", "pkg-1.0.dist-info", ("pkg/a.py", "pkg/b.py", "pkg/gone.py",
                                                          "pkg-1.0.dist-info/RECORD"))
    plan = core.plan_dist(src, (old,), {"pkg/a.py": "A1", "pkg/b.py": "B", "pkg-2.0.dist-info/RECORD": None})
    assert plan.action is core.Action.UPGRADE and plan.old_version == "1.0"
    assert plan.send == ("pkg/a.py", "pkg-2.0.dist-info/RECORD") and plan.unchanged == 1
    assert plan.remove == ("pkg/gone.py",)  # the old dist-info goes whole, after the new files land
    assert plan.remove_dist_infos == ("pkg-1.0.dist-info",) and plan.send_bytes == 15


def test_nothing_to_change_and_stream_order() -> None:
    files = (core.SourceFile("p-1.dist-info/RECORD", "R", 1), core.SourceFile("p-1.dist-info/METADATA", "M", 1),
             core.SourceFile("p/x.py", "X", 1))
    src = core.SourceListing("lab1", PY311, {"p": core.SourceDist("p", "1", "p-1.dist-info", (), (), files)})
    same = core.TargetListing(PY311, {"p": (core.InstalledDist("1", "p-1.dist-info", tuple(f.rel for f in files)),)},
                              {"p-1.dist-info/RECORD": "R", "p-1.dist-info/METADATA": "M", "p/x.py": "X"})
    assert not core.plan_host("t", "/v", src, same).changes
    fresh = core.TargetListing(PY311, {}, {})
    plan = core.plan_host("t", "/v", src, fresh)
    assert [rel for _info, rel in stream.send_order(src, plan)] == [
        "p/x.py", "p-1.dist-info/METADATA", "p-1.dist-info/RECORD"]


def test_relocate_bytes_rewrites_only_whole_prefixes_in_text() -> None:
    r = remote("relocate")
    script = b"#!/root/src/bin/python\nimport sys\n# see /root/src2/x and '/root/src'\n"
    assert r["relocate_bytes"](script, "/root/src", "/srv/dst") == (
        b"#!/srv/dst/bin/python\nimport sys\n# see /root/src2/x and '/srv/dst'\n")
    assert r["relocate_bytes"](b"\x7fELF\0/root/src/lib", "/root/src", "/srv/dst") is None
    assert r["relocate_bytes"](b"nothing here", "/root/src", "/srv/dst") is None


def test_an_identical_pip_install_matches_by_tree_though_its_record_has_crlf_and_pyc_rows(tmp_path: Path) -> None:
    """pip writes RECORD with "\\r\\n" and lists the .pyc it compiled; the source sends RECORD
    without them, with "\\n". The target compares its RECORD by rows (issue 16: an identical copy of
    the full venv planned a new RECORD for every one of its 207 distributions)."""
    src, tgt = remote("overlay_source"), remote("overlay_target")
    prefix = tmp_path / "venv"
    site = prefix / "lib" / "python3.11" / "site-packages"
    info = site / "pkg-1.dist-info"
    (site / "pkg" / "__pycache__").mkdir(parents=True)
    info.mkdir()
    files = {"pkg/__init__.py": b"x = 1\n", "pkg/__pycache__/__init__.cpython-311.pyc": b"\0pyc",
             "pkg-1.dist-info/METADATA": b"Name: pkg\nVersion: 1\n"}
    for rel, data in files.items():
        (site / rel).write_bytes(data)
    rows = [f"{rel},sha256={sha(data)},{len(data)}" for rel, data in files.items()] + ["pkg-1.dist-info/RECORD,,"]
    (info / "RECORD").write_bytes(("\r\n".join(rows) + "\r\n").encode())
    dist = src["Dist"](str(site), info.name, str(prefix), str(prefix))
    described = src["describe"](dist, "pkg", "1")
    assert b"\r\n" not in dist.record() and b".pyc" not in dist.record()
    listed = [os.path.normpath(r[0]) for r in tgt["read_record"](str(info)) if not tgt["is_bytecode"](r[0])]
    assert tgt["tree_of"](str(site), info.name, listed, tgt["HashCache"](None, str(prefix))) == described["tree"]
    (sent,) = [f for f in described["files"] if f[0] == "pkg-1.dist-info/RECORD"]
    assert tgt["comparable_record_hash"](str(info)) == sent[1]  # the per-file plan agrees too
    (info / "RECORD").write_bytes((info / "RECORD").read_bytes().replace(sha(b"x = 1\n").encode(), b"other"))
    assert tgt["comparable_record_hash"](str(info)) != sent[1]


def test_relocate_venv_rewrites_scripts_and_their_record_rows(tmp_path: Path) -> None:
    r = remote("relocate")
    old, venv = "/old/venv", tmp_path / "venv"
    site = venv / "lib" / "python3.11" / "site-packages"
    info = site / "tool-1.dist-info"
    info.mkdir(parents=True)
    (venv / "bin").mkdir()
    script = venv / "bin" / "tool"
    script.write_bytes(f"#!{old}/bin/python\nprint(1)\n".encode())
    script.chmod(0o755)
    (venv / "bin" / "activate").write_text(f"VIRTUAL_ENV='{old}'\n")
    (info / "RECORD").write_text(f"../../../bin/tool,sha256={sha(script.read_bytes())},{script.stat().st_size}\n"
                                 "tool-1.dist-info/RECORD,,\n")
    changed = r["relocate_venv"](str(venv), old, str(venv))
    assert sorted(os.path.basename(p) for p in changed) == ["activate", "tool"]
    assert script.read_text().startswith(f"#!{venv}/bin/python\n") and os.access(script, os.X_OK)
    row = (info / "RECORD").read_text().splitlines()[0]
    assert row == f"../../../bin/tool,sha256={sha(script.read_bytes())},{script.stat().st_size}"
    assert not list(venv.rglob("*.fleetctl-tmp"))


def test_venv_overlay_cli_refuses_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from cli_support import run_cli

    inv = tmp_path / "inv.yml"
    inv.write_text("all:\n  hosts:\n    a:\n      ansible_connection: local\n    b:\n      ansible_connection: local\n")
    r = run_cli(capsys, "-i", str(inv), "venv", "overlay", "--from", "zz", "--venv", "/v")
    assert r.rc == 3 and r.err.strip() == f"fleetctl: error: --from zz: no such host in {inv}"
    r = run_cli(capsys, "-i", str(inv), "-l", "a", "venv", "overlay", "--from", "a", "--venv", "/v")
    assert r.rc == 3 and "no target hosts" in r.err
    r = run_cli(capsys, "-i", str(inv), "venv", "overlay", "--from", "a", "--venv", "/v", "--direct")
    assert r.rc == 3 and r.err.strip() == ("fleetctl: error: --direct: a is not reached over ssh, so targets cannot "
                                           "pull from it; drop --direct")


def test_direct_source_deframes_the_sources_stream_after_its_magic() -> None:
    target = remote("overlay_target")
    payload = os.urandom(3000) + b"x" * 600000
    packed = zlib.compress(payload, 1)
    frames = b"".join(struct.pack(">I", len(packed[i:i + 70000])) + packed[i:i + 70000]
                      for i in range(0, len(packed), 70000))
    script = ("import sys,struct,json\n"
              "n=struct.unpack('>I',sys.stdin.buffer.read(4))[0]\n"
              "assert json.loads(sys.stdin.buffer.read(n))=={'send':[]}\n"
              "sys.stdout.buffer.write(b'motd\\n'+open(sys.argv[1],'rb').read())\n")
    with tempfile.NamedTemporaryFile() as blob:
        blob.write(target["STREAM_MAGIC"] + frames + struct.pack(">I", 0))
        blob.flush()
        direct = target["DirectSource"]({"argv": [sys.executable, "-c", script, blob.name], "params": {"send": []}})
        try:
            direct.start()
            got = target["Decompressor"](direct.read)
            assert got.read() == payload
            assert direct.read(10) == b""
        finally:
            direct.close()


def test_direct_source_that_cannot_connect_says_why_in_one_line() -> None:
    target = remote("overlay_target")
    argv = ["sh", "-c", "cat >/dev/null; echo 'No ED25519 host key is known for 10.0.0.1.' >&2; "
                        "echo 'Host key verification failed.' >&2; exit 255"]
    direct = target["DirectSource"]({"argv": argv, "params": {"send": []}})
    try:
        with pytest.raises(target["DirectError"], match=r"^Host key verification failed$"):
            direct.start()
    finally:
        direct.close()
    line = stream.direct_failure("lab2", "lab1", "Host key verification failed")
    assert line == ("lab2 cannot reach lab1 directly: Host key verification failed; "
                    "pin lab1's key in lab2's ~/.ssh/known_hosts or drop --direct")


def test_direct_argv_uses_the_sources_connection_and_the_targets_key() -> None:
    from types import SimpleNamespace

    from fleetctl.connection import ConnectionSpec

    source = SimpleNamespace(name="lab1", connector=None, host=SimpleNamespace(
        connection=ConnectionSpec("ssh", "10.0.0.1", 2222, "ops", connect_timeout=7.0)))
    target = SimpleNamespace(name="lab2", vars={"direct_ssh_key": "/root/.ssh/fleet key"})
    command = stream.stream_command("overlay_source", "/opt/my venv/bin/python")
    argv = stream.direct_argv(source, target, command)  # type: ignore[arg-type]
    assert argv[:5] == ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes"]
    assert argv[argv.index("-i") + 1] == "/root/.ssh/fleet key" and argv[argv.index("-p") + 1] == "2222"
    assert argv[-2:] == ["ops@10.0.0.1", command] and "StrictHostKeyChecking=no" not in argv
    words = shlex.split(command)
    assert words[:4] == ["if", "[", "-x", "/opt/my venv/bin/python"]
    assert words[words.index("exec"):words.index("exec") + 3] == ["exec", "/opt/my venv/bin/python", "-c"]


def test_direct_argv_checks_every_jump_hop_strictly_as_the_controller_resolved_it(tmp_path: Path) -> None:
    """Each hop a ProxyCommand of its own with StrictHostKeyChecking=yes (not -J, whose hops follow the
    target's ssh_config), first hop innermost, its %-tokens doubled once per level; a hop that is not
    a plain [user@]host[:port] is refused."""
    from types import SimpleNamespace

    from fleetctl.connection import ConnectionSpec
    from fleetctl.errors import HostError
    from fleetctl.transport.target import SSHTarget

    known = tmp_path / "known_hosts"
    first = SSHTarget("10.0.0.1", 22, "jump", known, 5.0)
    second = SSHTarget("bastion-2", 2200, "ops", known, 5.0, jump=first)
    connector = SimpleNamespace(target=SSHTarget("10.0.0.9", 22, "root", known, 5.0, jump=second))
    source = SimpleNamespace(name="lab1", connector=connector, host=SimpleNamespace(
        connection=ConnectionSpec("ssh", "10.0.0.9", 22, "root", jump="b2")))
    target = SimpleNamespace(name="lab2", vars={})
    argv = stream.direct_argv(source, target, "true")  # type: ignore[arg-type]
    assert "-J" not in argv
    outer = shlex.split(argv[argv.index("-o", argv.index("ServerAliveCountMax=3")) + 1].removeprefix("ProxyCommand="))
    assert outer[-3:] == ["%h:%p", "--", "bastion-2"] and outer[outer.index("-p") + 1] == "2200"
    assert "StrictHostKeyChecking=yes" in outer and "BatchMode=yes" in outer and outer[outer.index("-l") + 1] == "ops"
    inner = shlex.split(next(a for a in outer if a.startswith("ProxyCommand=")).removeprefix("ProxyCommand="))
    assert inner[-3:] == ["%%h:%%p", "--", "10.0.0.1"] and "StrictHostKeyChecking=yes" in inner
    assert inner[inner.index("-l") + 1] == "jump"
    hostile = SimpleNamespace(name="lab1", connector=None, host=SimpleNamespace(
        connection=ConnectionSpec("ssh", "10.0.0.9", 22, "root", jump="x;touch /tmp/p@-oProxyCommand=id")))
    with pytest.raises(HostError, match=r"--direct: jump host .* must be \[user@\]host\[:port\]"):
        stream.direct_argv(hostile, target, "true")  # type: ignore[arg-type]


@pytest.mark.parametrize("level", [0, 1])
def test_the_stream_carries_a_large_binary_from_its_file_and_lands_it_whole(tmp_path: Path, level: int) -> None:
    """The source's framing (level 0: tar's own bytes; above 0: zlib) read back by the target's
    reader: every member as it was sent. A large binary goes from the open file (binary_file), a
    large text file (which may need relocating) does not; a cut stream is an EOFError, never a
    short file."""
    import io
    import tarfile

    source, target = remote("overlay_source"), remote("overlay_target")
    big = tmp_path / "libbig.so"
    big.write_bytes(b"\x7fELF\0" + os.urandom(3 << 20))
    text = tmp_path / "big.py"
    text.write_bytes(b"x = 1\n" * (300 << 10))
    assert source["binary_file"](str(text), text.stat().st_size) is None
    assert source["binary_file"](str(tmp_path / "missing"), 5 << 20) is None
    out = io.BytesIO()
    framer = source["Framer"](out, level)
    with tarfile.open(fileobj=framer, mode="w|", bufsize=1 << 20) as tar:
        for path in (big, text):
            handle = source["binary_file"](str(path), path.stat().st_size) or io.BytesIO(path.read_bytes())
            assert (path == big) == (not isinstance(handle, io.BytesIO))
            item = tarfile.TarInfo(path.name)
            item.size = path.stat().st_size
            tar.addfile(item, handle)
            handle.close()
    framer.close()
    raw, payload = out.getvalue(), bytearray()
    while True:
        size = struct.unpack(">I", raw[:4])[0]
        if size == 0:
            break
        payload += raw[4:4 + size]
        raw = raw[4 + size:]
    assert (len(payload) < big.stat().st_size + text.stat().st_size) == (level > 0)  # text compresses

    def reader(data: bytes) -> Any:  # a pipe: short reads, and a read for more than has come would block
        stream = io.BytesIO(data)
        return target["Decompressor"](lambda n: stream.read(min(n, 70000)), level > 0)

    got = {}
    with tarfile.open(fileobj=reader(bytes(payload)), mode="r|") as tar:
        for member in tar:
            got[member.name] = tar.extractfile(member).read()  # type: ignore[union-attr]
    assert got == {"libbig.so": big.read_bytes(), "big.py": text.read_bytes()}
    with pytest.raises(EOFError), tarfile.open(fileobj=reader(bytes(payload[:2 << 20])), mode="r|") as tar:
        for member in tar:
            tar.extractfile(member).read()  # type: ignore[union-attr]


def _target_run(venv: Path, plan: dict[str, Any], members: dict[str, bytes]) -> dict[str, Any]:
    """overlay_target's stream command in ``venv``, fed as the controller feeds it over SSH: the
    framed plan, then an uncompressed tar through a pipe (short reads, no end of input)."""
    import io
    import json
    import subprocess
    import tarfile

    tar_bytes = io.BytesIO()
    with tarfile.open(fileobj=tar_bytes, mode="w|") as tar:
        for name, data in members.items():
            item = tarfile.TarInfo(name)
            item.size, item.mode = len(data), 0o644
            tar.addfile(item, io.BytesIO(data))
    body = json.dumps(plan).encode()
    command = stream.stream_command("overlay_target", str(venv / "bin" / "python"))
    proc = subprocess.Popen(["sh", "-c", command], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(struct.pack(">I", len(body)) + body + tar_bytes.getvalue())
    proc.stdin.flush()  # left open: the controller closes its side only after the answer
    out = b""
    while b"@@FLEETCTL-JSON-END@@" not in out:
        chunk = proc.stdout.read1(1 << 16)
        assert chunk, out
        out += chunk
    proc.stdin.close()
    proc.wait(timeout=30)
    return json.loads(out.split(b"@@FLEETCTL-JSON-BEGIN@@")[1].split(b"@@FLEETCTL-JSON-END@@")[0])


def test_the_target_checks_each_file_against_the_sources_hash_and_caches_it(tmp_path: Path) -> None:
    """A file lands only with the hash the source listed; its hash goes into the target's overlay
    cache, so the next listing only stats it. A file that changed on the source between its listing
    and the stream is refused, nothing of it in place."""
    import json
    import subprocess

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3.*/site-packages"))
    good, listed = b"X = 1\n", b"X = 2\n"
    info = "tiny-1.0.dist-info"
    meta = {f"{info}/METADATA": b"Metadata-Version: 2.1\nName: tiny\nVersion: 1.0\n",
            f"{info}/RECORD": f"tiny.py,sha256={sha(good)},6\n{info}/METADATA,,\n{info}/RECORD,,\n".encode()}

    def plan(digest: str) -> dict[str, Any]:
        return {"expect": ["tiny.py", *meta], "remove": [], "remove_dist_infos": [],
                "new_dist_infos": {info: list(meta)}, "level": 0,
                "state_dir": str(tmp_path / "state"), "cache_dir": str(tmp_path / "cache"),
                "manifest": {"schema": 1, "source_host": "src", "source_venv": "/v", "target_venv": str(venv),
                             "time": "now", "dists": [{"name": "tiny", "version": "1.0", "old_version": None,
                                                       "action": "add", "dist_info": info,
                                                       "files": {"tiny.py": digest}}]}}

    changed = _target_run(venv, plan(sha(listed)), {"tiny.py": good, **meta})
    assert changed["ok"] is False and changed["error"] == (
        f"ChangedAtSource: tiny.py arrived with sha256 {sha(good)}, not the {sha(listed)} the source listed: it "
        "changed on the source during the transfer; run again"), changed
    assert not (site / "tiny.py").exists() and not list(site.rglob("*.fleetctl-tmp*"))
    done = _target_run(venv, plan(sha(good)), {"tiny.py": good, **meta})
    assert done["ok"] is True and done["result"]["written"] == 3, done
    assert (site / "tiny.py").read_bytes() == good
    (cached,) = (tmp_path / "cache").glob("overlay-*.json")
    st = (site / "tiny.py").stat()
    assert json.loads(cached.read_text())[str(site / "tiny.py")] == [st.st_size, st.st_mtime_ns, st.st_ino,
                                                                     sha(good), None]


def test_the_source_reads_a_large_binary_once_and_its_record_row_stays(tmp_path: Path) -> None:
    """A large binary goes from its open file (binary_file); building the RECORD after it must not
    open and hash the whole file a second time (issue 37: in the full environment most of the 10 GB
    is such libraries), and its RECORD row is the installed one, as for any file never relocated."""
    import io
    import json
    import subprocess
    import tarfile

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3.*/site-packages"))
    (site / "pkg").mkdir()
    (site / "pkg-1.dist-info").mkdir()
    files = {"pkg/libbig.so": b"\x7fELF\0" + os.urandom(3 << 20), "pkg/__init__.py": b"x = 1\n",
             "pkg-1.dist-info/METADATA": b"Name: pkg\nVersion: 1\n"}
    for rel, data in files.items():
        (site / rel).write_bytes(data)
    rows = [f"{rel},sha256={sha(data)},{len(data)}" for rel, data in files.items()] + ["pkg-1.dist-info/RECORD,,"]
    (site / "pkg-1.dist-info" / "RECORD").write_text("\n".join(rows) + "\n")
    words = shlex.split(stream.stream_command("overlay_source", str(venv / "bin" / "python")))
    code = words[words.index("-c") + 1]
    hook = ("import sys\ndef _seen(event, args):\n    if event == 'open' and str(args[0]).endswith('libbig.so'):\n"
            "        sys.stderr.write('@@OPENED\\n')\nsys.addaudithook(_seen)\n")
    send = [["pkg-1.dist-info", rel] for rel in files] + [["pkg-1.dist-info", "pkg-1.dist-info/RECORD"]]
    body = json.dumps({"send": send, "target_prefix": str(venv), "level": 0}).encode()
    proc = subprocess.run([str(venv / "bin" / "python"), "-c", hook + code], input=struct.pack(">I", len(body)) + body,
                          capture_output=True, check=True)
    raw, payload = proc.stdout.split(stream.STREAM_MAGIC, 1)[1], bytearray()
    while (size := struct.unpack(">I", raw[:4])[0]) != 0:
        payload += raw[4:4 + size]
        raw = raw[4 + size:]
    with tarfile.open(fileobj=io.BytesIO(bytes(payload)), mode="r|") as tar:
        got = {m.name: tar.extractfile(m).read() for m in tar}  # type: ignore[union-attr]
    big = files["pkg/libbig.so"]
    assert got["pkg/libbig.so"] == big
    assert f"pkg/libbig.so,sha256={sha(big)},{len(big)}" in got["pkg-1.dist-info/RECORD"].decode()
    assert proc.stderr.decode().count("@@OPENED") == 1, proc.stderr.decode()[-2000:]


def test_the_stream_tar_is_tarfiles_own_and_reads_back_names_tar_cannot_hold_in_its_header() -> None:
    """overlay_tar writes the header tarfile writes for a short ASCII name and tarfile's pax header
    for a long or non-ASCII one; its reader gives every regular file back (pax and GNU long names,
    folders skipped), says a cut stream is EOFError and a damaged header is not a tar."""
    import io
    import tarfile

    ns = remote("overlay_target")
    plain = tarfile.TarInfo("pkg/mod.py")
    plain.size, plain.mode, plain.mtime = 11, 0o755, 1700000000
    built = ns["tar_header"]("pkg/mod.py", 11, 0o755, 1700000000)
    parsed = tarfile.TarInfo.frombuf(built, "utf-8", "surrogateescape")
    assert len(built) == 512 and (parsed.name, parsed.size, parsed.mode, parsed.mtime) == ("pkg/mod.py", 11, 0o755,
                                                                                            1700000000)
    assert built == plain.tobuf(tarfile.USTAR_FORMAT, "utf-8", "surrogateescape")[:329] + bytes(183)
    files = {"pkg/" + "d" * 120 + "/long.py": b"long\n", "pkg/données.py": b"x = 1\n", "pkg/empty.py": b""}
    out = io.BytesIO()
    for name, data in files.items():
        out.write(ns["tar_header"](name, len(data), 0o644, 1700000000) + data + ns["tar_padding"](len(data)))
    gnu = io.BytesIO()
    with tarfile.open(fileobj=gnu, mode="w", format=tarfile.GNU_FORMAT) as tar:
        folder = tarfile.TarInfo("pkg/sub")
        folder.type = tarfile.DIRTYPE
        tar.addfile(folder)
        item = tarfile.TarInfo("pkg/" + "g" * 150 + ".py")
        item.size = 3
        tar.addfile(item, io.BytesIO(b"gnu"))
    stream = out.getvalue() + gnu.getvalue()[:-1024] + ns["END_OF_ARCHIVE"]

    def read_all(data: bytes) -> dict[str, bytes]:
        piped = io.BytesIO(data)
        reader, got = ns["TarReader"](type("Pipe", (), {"read": lambda self, n: piped.read(min(n, 700))})()), {}
        while (member := reader.next_file()) is not None:
            got[member[0]] = b"".join(reader.chunks(member[3], 4))
        return got

    assert read_all(stream) == {**files, "pkg/" + "g" * 150 + ".py": b"gnu"}
    with pytest.raises(EOFError):
        read_all(stream[:700])
    with pytest.raises(ns["TarError"], match="not a tar"):
        read_all(b"x" + stream[1:])


def test_the_target_lands_each_file_with_its_mode_at_creation_and_no_chmod_the_umask_allows(tmp_path: Path) -> None:
    """Each file is created under its temporary name with its final mode; a separate chmod only where
    the umask took bits away (0777 under umask 022), never for 0644, 0755 or 0600 (issue 37: a chmod,
    and a path-based utime, per file on top of what `tar -x` does). Modes, mtimes and bytes are the
    source's, each file's hash goes into the target's cache, no temporary file is left."""
    import io
    import json
    import subprocess
    import tarfile

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3.*/site-packages"))
    modes = {"pkg/a.py": 0o644, "pkg/sub/run.sh": 0o755, "pkg/sub/secret.cfg": 0o600, "pkg/open.txt": 0o777}
    data = {rel: rel.encode() * 3 for rel in modes}
    tar_bytes = io.BytesIO()
    with tarfile.open(fileobj=tar_bytes, mode="w|") as tar:
        for rel, mode in modes.items():
            item = tarfile.TarInfo(rel)
            item.size, item.mode, item.mtime = len(data[rel]), mode, 1600000000
            tar.addfile(item, io.BytesIO(data[rel]))
    body = tar_bytes.getvalue()
    plan = {"expect": list(modes), "remove": [], "remove_dist_infos": [], "new_dist_infos": {}, "level": 0,
            "state_dir": str(tmp_path / "state"), "cache_dir": str(tmp_path / "cache"),
            "manifest": {"schema": 1, "source_host": "src", "source_venv": "/v", "target_venv": str(venv),
                         "time": "now", "dists": []}}
    hook = ("import os, sys\nos.umask(0o022)\ndef _seen(event, args):\n"
            "    if event == 'os.chmod':\n        sys.stderr.write('@@CHMOD %r\\n' % (args[0],))\n"
            "sys.addaudithook(_seen)\n")
    words = shlex.split(stream.stream_command("overlay_target", str(venv / "bin" / "python")))
    code = words[words.index("-c") + 1]
    plan_bytes = json.dumps(plan).encode()
    proc = subprocess.run([str(venv / "bin" / "python"), "-c", hook + code], capture_output=True,
                          input=struct.pack(">I", len(plan_bytes)) + plan_bytes + body, check=True)
    answer = json.loads(proc.stdout.split(b"@@FLEETCTL-JSON-BEGIN@@")[1].split(b"@@FLEETCTL-JSON-END@@")[0])
    assert answer["ok"] is True and answer["result"]["written"] == 4, answer
    assert proc.stderr.decode().count("@@CHMOD") == 1, proc.stderr.decode()[-2000:]
    cache = json.loads(next((tmp_path / "cache").glob("overlay-*.json")).read_text())
    for rel, mode in modes.items():
        st = (site / rel).stat()
        assert (st.st_mode & 0o7777, st.st_mtime, (site / rel).read_bytes()) == (mode, 1600000000, data[rel])
        assert cache[str(site / rel)] == [st.st_size, st.st_mtime_ns, st.st_ino, sha(data[rel]), None]
    assert not list(site.rglob("*.fleetctl-tmp*"))


def _one_dist_venv(prefix: Path, files: dict[str, bytes]) -> tuple[Path, Path]:
    """A venv's site-packages holding one distribution, pkg 1, of ``files`` and their RECORD."""
    site = prefix / "lib" / "python3.11" / "site-packages"
    info = site / "pkg-1.dist-info"
    (site / "pkg").mkdir(parents=True)
    info.mkdir()
    for rel, data in files.items():
        (site / rel).write_bytes(data)
    rows = [f"{rel},sha256={sha(data)},{len(data)}" for rel, data in files.items()] + ["pkg-1.dist-info/RECORD,,"]
    (info / "RECORD").write_text("\n".join(rows) + "\n")
    return site, info


def test_a_cold_sources_listing_hashed_on_threads_answers_as_hashed_in_turn(tmp_path: Path) -> None:
    """A fresh source hashes every file it lists (~25 s on one core for the 10 GB environment while the
    other cores waited): those no cache answers for are now hashed ahead on threads, a large binary
    from the file in chunks. The descriptions are the same as hashing them one at a time, a text file
    naming the venv's prefix is still relocated, and the filled cache answers the next listing."""
    src = remote("overlay_source")
    prefix = tmp_path / "venv"
    blob = os.urandom(1 << 20)
    files = {f"pkg/lib{i}.so": b"\x7fELF\0" + blob * (3 + i) for i in range(4)}  # 3-6 MiB binaries, 18 MiB
    files["pkg/small.so"] = b"\x7fELF\0tiny"
    files["pkg/__init__.py"] = b"x = 1\n"
    files["pkg/paths.py"] = f"HOME = '{prefix}/share'\n".encode() + b"# pad\n" * 300_000  # text over 1 MiB
    files["pkg-1.dist-info/METADATA"] = b"Name: pkg\nVersion: 1\n"
    site, info = _one_dist_venv(prefix, files)
    moved_to = "/srv/other-venv"

    def listing(cache_dir: Path | None, ahead: bool) -> tuple[dict[str, Any], Any]:
        cache = src["HashCache"](str(cache_dir) if cache_dir else None, str(prefix))
        dist = src["Dist"](str(site), info.name, str(prefix), moved_to, cache)
        if ahead:
            src["hash_ahead"]([dist])
            assert len(dist.ahead) == len(files)  # every file was hashed ahead, on threads
        return src["describe"](dist, "pkg", "1"), cache

    in_turn, _ = listing(None, ahead=False)
    ahead, cache = listing(tmp_path / "cache", ahead=True)
    assert ahead == in_turn
    by_rel = {f[0]: f for f in ahead["files"]}
    for rel, data in files.items():
        if rel != "pkg/paths.py":
            assert by_rel[rel][1:] == [sha(data), len(data), False]  # the bytes as they are
    relocated = files["pkg/paths.py"].replace(str(prefix).encode(), moved_to.encode())
    assert by_rel["pkg/paths.py"][1:] == [sha(relocated), len(relocated), True]
    cache.save()
    again = src["HashCache"](str(tmp_path / "cache"), str(prefix))
    dist = src["Dist"](str(site), info.name, str(prefix), moved_to, again)
    reads = [rel for rel, _d, _s in dist.rows if rel in files and dist.needs_reading(dist.located(rel))]
    assert reads == ["pkg/paths.py"]  # the cache answers for every file but the one naming the prefix


def test_a_listing_looks_each_file_up_once_for_hashing_ahead_and_describing(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """hash_ahead and describe share one lookup per file (the full environment lists 76,042 files):
    each is lstat'ed once in a listing, not once per pass."""
    src = remote("overlay_source")
    prefix = tmp_path / "venv"
    files = {f"pkg/m{i}.py": f"X = {i}\n".encode() for i in range(5)}
    files["pkg-1.dist-info/METADATA"] = b"Name: pkg\nVersion: 1\n"
    site, info = _one_dist_venv(prefix, files)
    dist = src["Dist"](str(site), info.name, str(prefix), str(prefix), None)
    seen: list[str] = []
    real = os.lstat
    monkeypatch.setattr(os, "lstat", lambda path, *a, **kw: seen.append(str(path)) or real(path, *a, **kw))
    src["hash_ahead"]([dist])
    described = src["describe"](dist, "pkg", "1")
    assert sorted(f[0] for f in described["files"]) == sorted([*files, "pkg-1.dist-info/RECORD"])
    wanted = {str(site / rel) for rel in files}
    assert sorted(p for p in seen if p in wanted) == sorted(wanted)  # each file once (folders: realpath's)
