# Agent self-test operations: exercise the protocol's edges on a real host.
# Used by the agent tests and handy when debugging a host ("does the agent survive X?").
import os
import sys
import time


def main(params):
    action = params.get("action", "echo")
    if action == "echo":
        return {"echo": params.get("data"), "pid": os.getpid()}
    if action == "raise":
        raise RuntimeError(params.get("message", "raised on purpose"))
    if action == "sleep":
        if params.get("started"):  # a file made once the request is in the agent: a test sees it busy
            open(params["started"], "w").close()
        deadline = time.time() + float(params.get("seconds", 1))
        # until_removed: the request also ends as soon as the test removes that file (a hold that no
        # busy machine can end early or late)
        while time.time() < deadline and not (params.get("until_removed") and not os.path.exists(params["started"])):
            time.sleep(min(0.05, max(0.0, deadline - time.time())))
        return {"slept": params.get("seconds")}
    if action == "noise":
        # Stray prints must not corrupt the protocol stream.
        print("noise on stdout")
        sys.stderr.write("noise on stderr\n")
        os.system("echo noise from a subprocess")
        return {"quiet": True}
    if action == "die":
        os._exit(int(params.get("code", 9)))
    if action == "big":
        return {"data": "x" * int(params.get("size", 1024))}
    if action == "interpreter":
        return {"executable": sys.executable, "prefix": sys.prefix, "version": list(sys.version_info[:3])}
    raise ValueError("unknown selftest action %r" % (action,))
