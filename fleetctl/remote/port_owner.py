# Included by service_host (`# fleetctl-include: port_owner`).
# Which process listens on a TCP port: the health gate's proof that a 200 came from our server.
#
# A /health answer says nothing about who answered. An orphaned server from an earlier run (or any
# other process) on the port would make a new release look healthy while its own server is still
# loading, or has failed to bind. Linux only: /proc/net/tcp{,6} gives the listening sockets' inodes,
# /proc/PID/fd the sockets a process holds. Python 3.8, stdlib only (shipped to the host).

import os

LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's st column


def listening_inodes(port):
    """Inodes of the sockets listening on ``port`` (any address); None when /proc/net is unreadable."""
    found, readable = set(), False
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name, "r") as handle:
                rows = handle.read().splitlines()[1:]
        except (IOError, OSError):
            continue
        readable = True
        for row in rows:
            cols = row.split()
            if len(cols) > 9 and cols[3] == LISTEN and int(cols[1].rsplit(":", 1)[1], 16) == port:
                found.add(cols[9])
    return found if readable else None


def process_tree(root):
    """``root`` and every process below it (a server may listen from a child)."""
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry, "r") as handle:
                ppid = int(handle.read().rsplit(")", 1)[1].split()[1])
        except (IOError, OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, ()))
    return tree


def listens(pid, port):
    """True when ``pid`` (or a process below it) holds a socket listening on ``port``, False when
    another process does or none does, None when this user cannot tell (no /proc, fds unreadable)."""
    inodes = listening_inodes(int(port))
    if inodes is None:
        return None
    if not inodes:
        return False
    unreadable = False
    for member in process_tree(int(pid)):
        try:
            fds = os.listdir("/proc/%d/fd" % member)
        except (IOError, OSError):
            unreadable = True
            continue
        for fd in fds:
            try:
                link = os.readlink("/proc/%d/fd/%s" % (member, fd))
            except (IOError, OSError):
                continue
            if link.startswith("socket:[") and link[8:-1] in inodes:
                return True
    return None if unreadable else False
