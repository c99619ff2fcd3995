# Included by overlay_source.py and overlay_target.py (`# fleetctl-include: overlay_tar`): the overlay's
# tar stream, written and read without tarfile's stream mode, whose buffer is copied whole on every
# read and write (0.9 CPU-s of the target and 0.4 of the source for the 6,539 files of the sglang tree,
# most of the Python work per file). The bytes stay tar's: ustar headers, a pax header before a member
# whose name or size ustar cannot hold (tarfile writes those), two zero blocks at the end.
# Stdlib only, Python >= 3.8.
import tarfile

BLOCK = 512
ZERO_BLOCK = b"\0" * BLOCK
END_OF_ARCHIVE = ZERO_BLOCK * 2
USTAR_MAGIC = b"ustar\x0000"
MAX_OCTAL = 8 ** 11  # sizes and times with 11 octal digits; larger ones go in a pax header


def tar_header(name, size, mode, mtime):
    """A regular file's header blocks, as tarfile's PAX_FORMAT writes them: one ustar block built
    here when the name is short ASCII (every file of a usual venv), else tarfile's own pax + ustar."""
    raw = name.encode("utf-8", "surrogateescape")
    if len(raw) > 100 or not (0 <= size < MAX_OCTAL and 0 <= mtime < MAX_OCTAL) or not raw.isascii():
        item = tarfile.TarInfo(name)
        item.size, item.mode, item.mtime = size, mode, mtime
        return item.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
    block = bytearray(BLOCK)
    block[0:len(raw)] = raw
    block[100:148] = b"%07o\0%07o\0%07o\0%011o\0%011o\0" % (mode & 0o7777, 0, 0, size, int(mtime))
    block[148:156] = b"        "  # the checksum counts its own field as spaces
    block[156:157] = b"0"
    block[257:265] = USTAR_MAGIC
    block[148:156] = b"%06o\0 " % sum(block)
    return bytes(block)


def tar_padding(size):
    return ZERO_BLOCK[:-size % BLOCK]


class TarError(IOError):
    """The stream is not the tar the source writes (a bad header checksum)."""


def header_number(field):
    """A header's numeric field: octal text, or base-256 (first byte 0x80/0xff) for a large value."""
    if field[:1] in (b"\x80", b"\xff"):
        value = int.from_bytes(field[1:], "big")
        return value - (256 ** (len(field) - 1)) if field[:1] == b"\xff" else value
    text = field.split(b"\0", 1)[0].strip()
    return int(text, 8) if text else 0


def header_text(field):
    return field.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


def pax_records(data):
    """A pax extended header's "LEN key=value\\n" records."""
    found, pos = {}, 0
    while pos < len(data) and data[pos:pos + 1] != b"\0":
        space = data.index(b" ", pos)
        length = int(data[pos:space])
        key, _, value = bytes(data[space + 1:pos + length - 1]).partition(b"=")
        found[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return found


class TarReader(object):
    """The members of a tar read through `source.read(n)` (which may return less than n, as a pipe
    does, and raises EOFError when the stream is cut). next_file() gives each regular file's
    (name, mode, mtime, size) until the end of the archive (None); its bytes come from
    content(size) (whole) or chunks(size, n) before the next call. Reads only what the archive
    holds, never past its end (the sender keeps the pipe open for the answer)."""

    def __init__(self, source):
        self.source, self.left = source, 0

    def exact(self, n):
        out = self.source.read(n)
        if len(out) == n:
            return out
        parts, got = [out], len(out)
        while got < n:
            chunk = self.source.read(n - got)
            if not chunk:
                raise EOFError("the stream from the source ended early (connection dropped?)")
            parts.append(chunk)
            got += len(chunk)
        return b"".join(parts)

    def skip(self, n):
        while n > 0:
            n -= len(self.exact(min(n, 1 << 20)))

    def next_file(self):
        self.skip(self.left)  # what the caller left unread of the last member, and its padding
        self.left, pax = 0, {}
        while True:
            block = self.exact(BLOCK)
            if block == ZERO_BLOCK:
                return None
            if header_number(block[148:156]) != 256 + sum(block[:148]) + sum(block[156:]):
                raise TarError("the stream from the source is not a tar (bad header checksum)")
            kind, size = block[156:157], header_number(block[124:136])
            if kind in (b"x", b"L"):  # pax attributes or a GNU long name, for the next member
                data = self.exact(size + (-size % BLOCK))[:size]
                pax.update(pax_records(data) if kind == b"x" else {"path": header_text(data)})
                continue
            if "size" in pax:
                size = int(pax["size"])
            if kind not in (b"0", b"\0", b"7"):  # folders, links, global headers: nothing to land
                self.skip(size + (-size % BLOCK))
                continue
            name = header_text(block[0:100])
            prefix = header_text(block[345:500]) if block[257:265] == USTAR_MAGIC else ""
            name = pax.get("path") or (prefix + "/" + name if prefix else name)
            mtime = float(pax["mtime"]) if "mtime" in pax else header_number(block[136:148])
            self.left = size + (-size % BLOCK)
            return name, header_number(block[100:108]), mtime, size

    def content(self, size):
        data = self.exact(size)
        self.left -= size
        return data

    def chunks(self, size, n=1 << 20):
        while size > 0:
            data = self.exact(min(size, n))
            size -= len(data)
            self.left -= len(data)
            yield data
