# The host side of the playbook module `get_url`: the host downloads a URL itself (stdlib urllib:
# http, https, ftp, file), so large files never pass through the controller or its SSH channel.
#
# Stdlib only, Python >= 3.8. params: {url, dest, mode|None (int), checksum|None ("ALGO:HEX"),
# force, timeout, check}. As Ansible's get_url: an existing dest is kept when force is false and no
# checksum is given, or when its checksum matches; a download whose checksum differs is refused and
# nothing is written; the file replaces dest atomically (a temporary file beside it, renamed).
# -> {changed, dest, url, size, checksum_dest, checksum_src, status_code, msg}. Refusals raise GetUrlError.
import hashlib
import os
import shutil
import tempfile
from urllib import parse as urlparse
from urllib import request as urlrequest


class GetUrlError(Exception):
    pass


def _digest(path, algorithm):
    digest = hashlib.new(algorithm)
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _dest(params):
    dest = params["dest"]
    if os.path.isdir(dest):  # a folder: the URL's file name inside it, as Ansible
        name = os.path.basename(urlparse.urlparse(params["url"]).path) or "index.html"
        dest = os.path.join(dest, name)
    return dest


def _download(params, folder):
    fd, tmp = tempfile.mkstemp(prefix=".fleetctl-get_url-", dir=folder)
    try:
        with os.fdopen(fd, "wb") as out:
            reply = urlrequest.urlopen(params["url"], timeout=float(params.get("timeout") or 10))
            with reply:
                shutil.copyfileobj(reply, out, 1 << 20)
                status = getattr(reply, "status", None) or 200
    except Exception as exc:
        os.unlink(tmp)
        raise GetUrlError("%s: download failed: %s" % (params["url"], exc))
    return tmp, status


def main(params):
    dest = _dest(params)
    algorithm, _, want = (params.get("checksum") or "").partition(":")
    exists = os.path.isfile(dest)
    if exists and not params.get("force") and (not want or _digest(dest, algorithm) == want.lower()):
        return _done(params, dest, False, None, "file already exists")
    if params.get("check"):
        return _done(params, dest, True, None, "would download")
    tmp, status = _download(params, os.path.dirname(dest) or "/")
    try:
        if want and _digest(tmp, algorithm) != want.lower():
            raise GetUrlError("the checksum for %s did not match %s; it was %s"
                              % (params["url"], want, _digest(tmp, algorithm)))
        if exists and _digest(tmp, "sha1") == _digest(dest, "sha1"):
            os.unlink(tmp)
            return _done(params, dest, _mode(dest, params.get("mode")), status, "OK (unchanged)")
        os.chmod(tmp, params["mode"] if params.get("mode") is not None else 0o644 & ~_umask())
        os.replace(tmp, dest)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return _done(params, dest, True, status, "OK (%d bytes)" % os.path.getsize(dest))


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _mode(path, mode):
    if mode is None or (os.stat(path).st_mode & 0o7777) == mode:
        return False
    os.chmod(path, mode)
    return True


def _done(params, dest, changed, status, msg):
    if not changed and not params.get("check") and os.path.isfile(dest):
        changed = _mode(dest, params.get("mode"))
    exists = os.path.isfile(dest)
    return {"changed": changed, "dest": dest, "url": params["url"], "status_code": status, "msg": msg,
            "size": os.path.getsize(dest) if exists else None,
            "checksum_dest": _digest(dest, "sha1") if exists else None}
