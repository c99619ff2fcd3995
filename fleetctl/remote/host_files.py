"""The service's files in a release folder (included by ``release_host``). Stdlib only, Python >= 3.8;
uses ``release_host``'s atomic_write and safe_join."""

import os


def write_host_files(folder, params):
    """The service's files in a release folder: service.json (an instance's service.NAME.json), the
    stand-in, service.env and each instance's service.NAME.env (0600)."""
    for name, text in (params.get("extra_files") or {}).items():
        atomic_write(safe_join(folder, name), text.encode("utf-8"), 0o644)
    envs = dict(params.get("env_files") or {}, **{"service.env": params.get("env_file") or ""})
    for name, text in sorted(envs.items()):  # an instance's own service.NAME.env beside service.env
        env = safe_join(folder, name)
        atomic_write(env, text.encode("utf-8"), 0o600)
        share_with_service_user(env, params.get("service_user"))


def share_with_service_user(path, user):
    """service.env readable by the service's own user (spec service.user): root:<its group> 0640.
    A user running the service as itself keeps it 0600, its own."""
    if not user:
        return
    import pwd

    entry = pwd.getpwnam(user)
    if entry.pw_uid == os.geteuid():
        return
    os.chown(path, 0, entry.pw_gid)
    os.chmod(path, 0o640)
