# fleetctl-include: model_files
# `fleetctl models sync --hf-download`, on the seed host: the pinned revision of a Hugging Face repo put in
# the host's cache by the Hub's own `hf download`, before the fleet gets it from this host.
#
# Stdlib only, Python >= 3.8. params: {"cache", "repo", "revision", "token"?}. The token (the host var
# hf_token, vault-encrypted) reaches `hf` in its environment (HF_TOKEN), never on a command line, and is
# masked in any output this module answers with. `hf` is looked up on PATH, then ~/.local/bin and ~/bin
# (where `pip install --user huggingface_hub` puts it).
import os
import subprocess

TAIL = 1500  # characters of hf's output kept for a failure's line


def find_hf():
    home = os.path.expanduser("~")
    folders = os.environ.get("PATH", "").split(os.pathsep) + [os.path.join(home, ".local", "bin"),
                                                              os.path.join(home, "bin")]
    for folder in folders:
        path = os.path.join(folder, "hf")
        if folder and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def masked(text, token):
    return text.replace(token, "***") if token else text


def main(params):
    cache, repo, revision, token = params["cache"], params["repo"], params["revision"], params.get("token")
    hf = find_hf()
    if hf is None:
        return {"error": "no `hf` command on this host (pip install huggingface_hub)"}
    env = dict(os.environ, HF_HUB_DISABLE_PROGRESS_BARS="1")
    env.pop("HF_HUB_OFFLINE", None)  # this download is the point
    env.pop("HF_TOKEN", None)
    if token:
        env["HF_TOKEN"] = token
    if not os.path.isdir(cache):
        os.makedirs(cache)
    proc = subprocess.Popen([hf, "download", repo, "--revision", revision, "--cache-dir", cache], env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = proc.communicate()[0].decode("utf-8", "replace")
    if proc.returncode != 0:
        last = masked(out, token).strip()[-TAIL:].replace("\n", " | ")
        return {"error": "`hf download %s --revision %s` exited %d: %s" % (repo, revision, proc.returncode, last)}
    found = hf_source_manifest(cache, repo, revision)
    if found.get("error"):
        return {"error": "after `hf download`: %s" % masked(found["error"], token)}
    return {"downloaded": True, "files": len(found["manifest"]["files"]),
            "bytes": found["manifest"]["total_bytes"]}
