# Included by host-side modules that write (`# fleetctl-include: writable`): before an operation
# changes anything, check that this user can write every folder it will write, and refuse in one
# line naming the path when it cannot; pick a per-user folder for caches this user cannot keep
# where root keeps them; and replace a cache file, private to this user, atomically.
#
# Stdlib only, Python >= 3.8. A target is [path, purpose, setting]: the folder (or file) the
# operation writes, what it is for ("deploy lock"), and the host var that moves it
# ("fleetctl_state_dir"), or None when no setting does.
import os
from stat import S_ISREG


class NotPermitted(Exception):
    """This user may not write where the operation must; nothing was changed. The agent reports the
    message as it is (one line), and the controller shows it as that host's failure."""


def login_name():
    try:
        import pwd

        return pwd.getpwuid(os.geteuid()).pw_name
    except (ImportError, KeyError):
        return "uid %d" % os.geteuid()


def nearest_existing(path):
    """``path`` when it exists, else its nearest existing parent: what creating it would write."""
    probe = os.path.abspath(path)
    while not os.path.lexists(probe) and probe != os.path.dirname(probe):
        probe = os.path.dirname(probe)
    return probe


def can_write(path):
    """Whether this user could write ``path`` or, where it does not exist yet, create it (and the
    parents it lacks) the way the operation would: os.makedirs from the nearest existing parent."""
    probe = nearest_existing(path)
    if os.path.isdir(probe):
        return os.access(probe, os.W_OK | os.X_OK)
    if probe != os.path.abspath(path):
        return False  # a file where a folder would have to be made
    return os.access(probe, os.W_OK) and os.access(os.path.dirname(probe) or "/", os.W_OK | os.X_OK)


def refusal(path, purpose, setting):
    user = login_name()
    line = "cannot write %s (%s) as %s: run with --become (-b)" % (path, purpose, user)
    if setting:
        line += " or set %s to a folder %s owns" % (setting, user)
    return line


def require_writable(targets):
    """Raise NotPermitted for the first target this user cannot write; nothing is created."""
    for path, purpose, setting in targets:
        if path and not can_write(path):
            raise NotPermitted(refusal(path, purpose, setting))


def user_cache_dir(wanted, name):
    """``wanted`` when this user can keep files there; else, for a non-root user, its own
    ~/.cache/fleetctl/NAME (root's default cache folder is not writable by anyone else)."""
    if wanted and (os.geteuid() == 0 or can_write(wanted)):
        return wanted
    if os.geteuid() == 0:
        return wanted
    return os.path.join(os.path.expanduser("~"), ".cache", "fleetctl", name)


def write_private(path, data):
    """Replace ``path`` with ``data``, private to this user (0600 in a 0700 folder), atomically: a
    concurrent reader sees the old or the new file. Returns an error text, None when written."""
    folder, tmp = os.path.dirname(path), None
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        st = os.stat(folder)
        if st.st_uid != os.geteuid():
            return "cache not saved: %s belongs to another user" % folder
        if st.st_mode & 0o077:
            os.chmod(folder, 0o700)
        tmp = "%s.%d.%s.tmp" % (path, os.getpid(), os.urandom(4).hex())
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.rename(tmp, path)
        tmp = None
    except (IOError, OSError) as exc:
        return "cache not saved: %s" % exc
    finally:
        if tmp:
            try:
                os.unlink(tmp)
            except OSError:
                pass
    return None


def read_private(path):
    """(bytes, None) of a cache file this user wrote, private to it (a regular file, its own, no
    access for others), symlinks not followed; (None, None) when there is none or it cannot be
    opened (the caller goes on as if there were none); (None, why) when it is not to be trusted."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None, None
    with os.fdopen(fd, "rb") as handle:
        st = os.fstat(handle.fileno())
        if not S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            return None, "not a private file of this user"
        return handle.read(), None
