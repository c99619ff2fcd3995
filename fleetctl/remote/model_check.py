# The quick tier of model verification, on the host: what stat and a few KB per shard can prove.
# Included by model_host.py (`# fleetctl-include: model_check`); stdlib only, Python >= 3.8.
#
# safetensors: an 8-byte little-endian header length N, N bytes of JSON {name: {dtype, shape,
# data_offsets: [begin, end]}} (and an optional __metadata__), then the byte buffer, indexed with no
# holes: 8 + N + max(end) == the file's size. The index (model.safetensors.index.json) maps every tensor
# to its shard; each shard named there exists and holds the tensors the index gives it.
import json
import os
import struct

MAX_HEADER = 100 * 1000 * 1000  # the format's own limit
# Bits per element of each dtype the safetensors format defines (its Rust crate's Dtype::bitsize, 0.8).
# A tensor's byte span must be exactly shape's product x bits / 8, as the crate checks when it loads
# (TensorInvalidInfo): a header whose spans tile the file but disagree with the shapes is damaged.
DTYPE_BITS = {"BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8,
              "F8_E8M0": 8, "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32,
              "C64": 64, "F64": 64, "I64": 64, "U64": 64}
INDEX_SUFFIX = ".safetensors.index.json"


def safetensors_problem(path, size):
    """None when the header parses and covers the file exactly; else what is wrong, in a few words.
    Also returns the tensor names (a set) for the index check."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(8)
            if len(head) < 8:
                return "shorter than a safetensors header (%d bytes)" % size, set()
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER or 8 + n > size:
                return "header length %d does not fit the file's %d bytes (truncated?)" % (n, size), set()
            raw = handle.read(n)
    except (IOError, OSError) as exc:
        return "unreadable: %s" % (exc.strerror or exc), set()
    try:
        header = json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        return "header is not JSON (damaged)", set()
    if type(header) is not dict:
        return "header is not a JSON object (damaged)", set()
    spans = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        offsets = info.get("data_offsets") if type(info) is dict else None
        if (type(offsets) is not list or len(offsets) != 2 or not all(type(x) is int for x in offsets)
                or not 0 <= offsets[0] <= offsets[1]):
            return "tensor %s has no valid data_offsets (damaged)" % name, set()
        shape_problem = tensor_size_problem(name, info, offsets[1] - offsets[0])
        if shape_problem:
            return shape_problem, set()
        spans.append((offsets[0], offsets[1]))
    spans.sort()
    end = 0
    for begin, stop in spans:
        if begin != end:
            return "tensor data has a hole or overlap at byte %d of the buffer (damaged)" % end, set()
        end = stop
    if 8 + n + end != size:
        return "header covers %d bytes but the file has %d (%s)" % (
            8 + n + end, size, "truncated" if size < 8 + n + end else "trailing bytes"), set()
    return None, set(k for k in header if k != "__metadata__")


def tensor_size_problem(name, info, span):
    """None when the tensor's dtype and shape give exactly its byte span. A dtype this table does not
    know (a newer format) is not judged: the span check above still holds for it."""
    bits = DTYPE_BITS.get(info.get("dtype"))
    shape = info.get("shape")
    if type(shape) is not list or not all(type(d) is int and d >= 0 for d in shape):
        return "tensor %s has no valid shape (damaged)" % name
    if bits is None:
        return None
    count = 1
    for dim in shape:
        count *= dim
    if count * bits % 8 or count * bits // 8 != span:
        return "tensor %s is %s %s (%d bytes) but its data spans %d bytes (damaged)" % (
            name, info.get("dtype"), shape, count * bits // 8, span)
    return None


def index_problems(base, index_rel, tensors_of):
    """[(file, what)] for an index whose weight_map names a shard that is absent or lacks a tensor.
    ``tensors_of``: shard path (relative) -> its tensor names, for the shards whose header parsed."""
    path = os.path.join(base, index_rel)
    try:
        with open(path, "r", encoding="utf-8") as handle:
            doc = json.load(handle)
    except (IOError, OSError, ValueError) as exc:
        return [(index_rel, "unreadable index: %s" % (getattr(exc, "strerror", None) or exc))]
    weight_map = doc.get("weight_map") if type(doc) is dict else None
    if type(weight_map) is not dict or not weight_map:
        return [(index_rel, "index has no weight_map")]
    folder = os.path.dirname(index_rel)
    out, missing_shards = [], set()
    for tensor, shard in sorted(weight_map.items()):
        rel = os.path.join(folder, shard) if folder else shard
        if rel in missing_shards:
            continue
        if not os.path.isfile(os.path.join(base, rel)):
            missing_shards.add(rel)
            out.append((rel, "named by %s's weight_map but absent" % index_rel))
        elif rel in tensors_of and tensor not in tensors_of[rel]:
            out.append((rel, "lacks tensor %s that %s maps to it" % (tensor, index_rel)))
            missing_shards.add(rel)  # one line per shard is enough
    return out


def structure_problems(base, rels, sizes):
    """The headers of every *.safetensors among ``rels`` and every index: [(file, what)].
    ``sizes``: rel -> the size found on disk."""
    out, tensors_of = [], {}
    for rel in rels:
        if rel.endswith(".safetensors") and rel in sizes:
            what, names = safetensors_problem(os.path.join(base, rel), sizes[rel])
            if what:
                out.append((rel, what))
            else:
                tensors_of[rel] = names
    for rel in rels:
        if rel.endswith(INDEX_SUFFIX) and rel in sizes:
            out.extend(index_problems(base, rel, tensors_of))
    return out
