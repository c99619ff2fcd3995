# The host side of the playbook modules `file` and `fetch`.
#
# Stdlib only, Python >= 3.8. Actions (paths are absolute host paths):
#   file: {path, state (file|directory|absent|touch|link|None), mode|None, owner|None, group|None,
#          src|None (link target), recurse, check} -> {changed, state, actions: [what was (or would
#          be) done]}. state None: the path's own kind (it must exist). Never follows a link it
#          changes; a folder is created with its parents, each given the mode/owner/group (Ansible's).
#   read: {path, max_bytes} -> {exists, kind, size, sha256, data_b64 (None over max_bytes)}.
#   stat: {path, follow, checksum_algorithm|None} -> Ansible's stat result keys ({exists: false} when absent).
# Refusals raise FileOpsError: the controller turns its message into the host's one-line failure.
import base64
import grp
import hashlib
import errno
import os
import pwd
import shutil
import stat as stat_mod
import time


class FileOpsError(Exception):
    pass


def _kind(path):
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None, None
    if stat_mod.S_ISLNK(st.st_mode):
        return "link", st
    if stat_mod.S_ISDIR(st.st_mode):
        return "directory", st
    if stat_mod.S_ISREG(st.st_mode):
        return "file", st
    return "other", st


def _uid(owner):
    if owner is None:
        return -1
    if str(owner).isdigit():
        return int(owner)
    try:
        return pwd.getpwnam(owner).pw_uid
    except KeyError:
        raise FileOpsError("owner %s: no such user on the host" % owner)


def _gid(group):
    if group is None:
        return -1
    if str(group).isdigit():
        return int(group)
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise FileOpsError("group %s: no such group on the host" % group)


def _attrs(path, st, mode, uid, gid, check, actions):
    """mode/owner/group of one path (not following a link); appends what changed."""
    if mode is not None and stat_mod.S_IMODE(st.st_mode) != mode and not stat_mod.S_ISLNK(st.st_mode):
        actions.append("mode %04o -> %04o" % (stat_mod.S_IMODE(st.st_mode), mode))
        if not check:
            os.chmod(path, mode)
    if (uid != -1 and st.st_uid != uid) or (gid != -1 and st.st_gid != gid):
        actions.append("owner %d:%d -> %d:%d" % (st.st_uid, st.st_gid, uid if uid != -1 else st.st_uid,
                                                gid if gid != -1 else st.st_gid))
        if not check:
            os.lchown(path, uid, gid)


def _walk(path):
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            yield os.path.join(root, name)


def _make_dirs(path, mode, uid, gid):
    missing = []
    while path and not os.path.lexists(path):
        missing.append(path)
        path = os.path.dirname(path.rstrip("/"))
    for folder in reversed(missing):  # Ansible's file module gives every folder it creates the attributes
        try:
            os.mkdir(folder, 0o755)
        except OSError as exc:  # made meanwhile by another run (a parent two tasks create at once): not ours
            if exc.errno != errno.EEXIST or not os.path.isdir(folder):
                raise
            continue
        if mode is not None:
            os.chmod(folder, mode)
        if uid != -1 or gid != -1:
            os.chown(folder, uid, gid)


def file_state(params):
    path = params["path"]
    state, mode, check = params.get("state"), params.get("mode"), bool(params.get("check"))
    uid, gid = _uid(params.get("owner")), _gid(params.get("group"))
    kind, st = _kind(path)
    actions = []
    if state is None:
        if kind is None:
            raise FileOpsError("%s does not exist (state: file only changes an existing file; use touch)" % path)
        state = "directory" if kind == "directory" else "file"
    if state == "absent":
        if kind is not None:
            actions.append("removed")
            if not check:
                shutil.rmtree(path) if kind == "directory" else os.unlink(path)
        return {"changed": bool(actions), "state": "absent", "actions": actions}
    change = _STATES.get(state)
    if change is None:
        raise FileOpsError("unknown state %r" % (state,))
    if change(path, kind, params, mode, check, actions):
        kind, st = _kind(path)  # it was created or replaced
    if st is not None and kind is not None:
        _attrs(path, st, mode, uid, gid, check, actions)
        if params.get("recurse") and kind == "directory":
            for sub in _walk(path):
                sub_kind, sub_st = _kind(sub)
                _attrs(sub, sub_st, None if sub_kind == "directory" else mode, uid, gid, check, actions)
    return {"changed": bool(actions), "state": state, "actions": actions}


# Each state's change: refuses in one line, appends what it did (or would do), and says whether the path
# was made or replaced (its kind and stat read again).
def _state_file(path, kind, params, mode, check, actions):
    if kind is None:
        raise FileOpsError("%s does not exist (state: file does not create files; use touch or copy)" % path)
    if kind not in ("file", "link"):
        raise FileOpsError("%s is a %s, not a file" % (path, kind))
    return False


def _state_directory(path, kind, params, mode, check, actions):
    if kind is None:
        actions.append("created the folder")
        if not check:
            _make_dirs(path, mode, _uid(params.get("owner")), _gid(params.get("group")))
            return True
    elif kind != "directory":
        raise FileOpsError("%s is a %s, not a folder" % (path, kind))
    return False


def _state_touch(path, kind, params, mode, check, actions):
    if kind is not None:
        actions.append("touched")  # Ansible's touch changes the times: always changed
        if not check and kind != "link":
            os.utime(path, (time.time(), time.time()), follow_symlinks=False)
        return False
    actions.append("created an empty file")
    if check:
        return False
    parent = os.path.dirname(path) or "/"
    if not os.path.isdir(parent):
        raise FileOpsError("parent folder %s does not exist (create it first)" % parent)
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode if mode is not None else 0o644))
    return True


def _state_link(path, kind, params, mode, check, actions):
    src = params.get("src")
    if not src:
        raise FileOpsError("state: link needs src (what the link points to)")
    if kind == "link" and os.readlink(path) == src:
        return False
    if kind not in (None, "link", "file"):
        raise FileOpsError("%s is a %s; a link would replace it" % (path, kind))
    actions.append("link -> %s" % src)
    if check:
        return False
    tmp = "%s.fleetctl-link-%d" % (path, os.getpid())
    os.symlink(src, tmp)
    os.replace(tmp, path)
    return True


_STATES = {"file": _state_file, "directory": _state_directory, "touch": _state_touch, "link": _state_link}


def read(params):
    path = params["path"]
    kind, st = _kind(os.path.realpath(path))
    out = {"exists": kind is not None, "kind": kind, "size": None, "sha256": None, "data_b64": None}
    if kind != "file":
        return out
    out["size"] = st.st_size
    if st.st_size > int(params["max_bytes"]):
        return out
    with open(path, "rb") as handle:
        data = handle.read()
    out["sha256"] = hashlib.sha256(data).hexdigest()
    out["data_b64"] = base64.b64encode(data).decode("ascii")
    return out


def _names(st):
    try:
        owner = pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        owner = None
    try:
        group = grp.getgrgid(st.st_gid).gr_name
    except KeyError:
        group = None
    return owner, group


def stat_path(params):
    path = params["path"]
    try:
        st = os.stat(path) if params.get("follow") else os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return {"exists": False}
    m = st.st_mode
    owner, group = _names(st)
    out = {"exists": True, "path": path, "mode": "%04o" % stat_mod.S_IMODE(m), "isdir": stat_mod.S_ISDIR(m),
           "isreg": stat_mod.S_ISREG(m), "islnk": stat_mod.S_ISLNK(m), "isblk": stat_mod.S_ISBLK(m),
           "ischr": stat_mod.S_ISCHR(m), "isfifo": stat_mod.S_ISFIFO(m), "issock": stat_mod.S_ISSOCK(m),
           "size": st.st_size, "uid": st.st_uid, "gid": st.st_gid, "pw_name": owner, "gr_name": group,
           "mtime": st.st_mtime, "atime": st.st_atime, "ctime": st.st_ctime, "inode": st.st_ino,
           "dev": st.st_dev, "nlink": st.st_nlink, "readable": os.access(path, os.R_OK),
           "writeable": os.access(path, os.W_OK), "executable": os.access(path, os.X_OK)}
    if out["islnk"]:
        out["lnk_target"] = os.readlink(path)
        out["lnk_source"] = os.path.realpath(path)
    algorithm = params.get("checksum_algorithm")
    if out["isreg"] and algorithm and os.access(path, os.R_OK):
        digest = hashlib.new(algorithm)
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        out["checksum"] = digest.hexdigest()
    return out


def main(params):
    if not os.path.isabs(params.get("path", "")):
        raise FileOpsError("%s is not an absolute path" % params.get("path"))
    action = params.get("action")
    if action == "file":
        try:
            return file_state(params)
        except PermissionError as exc:
            raise FileOpsError("%s: permission denied" % (exc.filename or params["path"]))
    if action == "read":
        return read(params)
    if action == "stat":
        try:
            return stat_path(params)
        except PermissionError as exc:
            raise FileOpsError("%s: permission denied" % (exc.filename or params["path"]))
    raise FileOpsError("unknown action %r" % (action,))
