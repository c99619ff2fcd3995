# fleetctl-include: relocate
# The host side of the playbook modules `copy` and `template`: what a file holds now, and writing
# a new content atomically (relocate.atomic_write: a temporary name in the same folder, created
# with the final mode, then a rename).
#
# Stdlib only, Python >= 3.8. Actions (paths are absolute host paths):
#   stat:  {path, max_text} -> {exists, kind, mode, size, sha256, text (UTF-8 without NUL and at most
#          max_text bytes, else None), parent, parent_exists}. Read-only.
#   write: {path, data_b64, mode, expect_sha256|None} -> {path, sha256, mode, size}. Refuses when the
#          parent folder is missing (never creates folders) or when the file changed since `stat`
#          said `expect_sha256` (None: it did not exist).
# Refusals raise FilesError: the controller turns its message into the host's one-line failure.
import base64
import hashlib
import os
import stat as stat_mod


class FilesError(Exception):
    pass


def _target(path):
    # A symlink is written through (its target changes, the link stays), as `cp` does.
    return os.path.realpath(path) if os.path.islink(path) else path


def _text(path, size, max_text):
    if size > max_text:
        return None
    with open(path, "rb") as handle:
        data = handle.read(max_text + 1)
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def file_state(path, max_text):
    real = _target(path)
    parent = os.path.dirname(real) or "/"
    out = {"path": path, "real_path": real, "exists": False, "kind": None, "mode": None, "size": None,
           "sha256": None, "text": None, "parent": parent, "parent_exists": os.path.isdir(parent)}
    try:
        st = os.stat(real)
    except FileNotFoundError:
        return out
    out["exists"] = True
    if stat_mod.S_ISDIR(st.st_mode):
        out["kind"] = "directory"
        return out
    if not stat_mod.S_ISREG(st.st_mode):
        out["kind"] = "other"
        return out
    out.update(kind="file", mode=stat_mod.S_IMODE(st.st_mode), size=st.st_size, sha256=file_sha256(real),
               text=_text(real, st.st_size, max_text))
    return out


def write(path, data, mode, expect_sha256):
    real = _target(path)
    parent = os.path.dirname(real) or "/"
    if not os.path.isdir(parent):
        raise FilesError("parent folder %s does not exist (create it first)" % parent)
    if os.path.isdir(real):
        raise FilesError("%s is a folder" % real)
    now = file_sha256(real) if os.path.isfile(real) else None
    if now != expect_sha256:
        raise FilesError("%s changed on the host while this task ran; nothing written" % real)
    atomic_write(real, data, mode)  # from the relocate include
    st = os.stat(real)
    return {"path": path, "real_path": real, "sha256": hashlib.sha256(data).hexdigest(),
            "mode": stat_mod.S_IMODE(st.st_mode), "size": st.st_size}


def main(params):
    action = params.get("action")
    path = params["path"]
    if not os.path.isabs(path):
        raise FilesError("%s is not an absolute path" % path)
    if action == "stat":
        return file_state(path, int(params.get("max_text", 0)))
    if action == "write":
        data = base64.b64decode(params["data_b64"])
        return write(path, data, int(params["mode"]), params.get("expect_sha256"))
    raise FilesError("unknown action %r" % (action,))
