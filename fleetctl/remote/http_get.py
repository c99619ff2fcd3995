"""GET one URL from this host itself (the service is usually bound to 127.0.0.1) and describe it.

Stdlib only, Python >= 3.8. Runs inside the agent: urllib with a timeout, so it is bounded.
Proxies from the environment are ignored: the question is what the host itself sees. A refused
connection, a timeout or a body that is not JSON is an answer ("error_kind"), never a crash.

params:
  service_host, port: where the service listens (127.0.0.1, 30000)
  path:      the path asked for, e.g. "/server_info"
  fallbacks: paths tried in order when the one before answers 404 (older SGLang API names)
  timeout:   seconds for connect and for each read
  max_text:  characters of a non-JSON body kept
  max_body:  bytes read at most
"""

import json
import socket
import time
from urllib import error as urlerror
from urllib import parse as urlparse
from urllib import request as urlrequest

MAX_BODY = 8 * 1024 * 1024


def main(params):
    host = params.get("service_host") or "127.0.0.1"
    port = int(params.get("port") or 30000)
    paths = [params["path"]] + list(params.get("fallbacks") or [])
    timeout = float(params.get("timeout") or 10)
    tried = []
    answer = {}
    for path in paths:
        answer = fetch(url_for(host, port, path), timeout, int(params.get("max_body") or MAX_BODY),
                       int(params.get("max_text") or 4000))
        answer["path"] = path
        tried.append({"path": path, "status": answer["status"], "error_kind": answer["error_kind"]})
        if answer["status"] != 404:  # only "no such endpoint" sends us to the older name
            break
    answer["asked"] = paths[0]
    answer["tried"] = tried
    return answer


def url_for(host, port, path):
    if ":" in host and not host.startswith("["):
        host = "[%s]" % host  # an IPv6 literal
    return "http://%s:%d%s" % (host, port, path)


def fetch(url, timeout, max_body, max_text):
    answer = {"url": url, "status": None, "reason": None, "latency_ms": None, "content_type": None,
              "error_kind": None, "error": None}
    opener = urlrequest.build_opener(urlrequest.ProxyHandler({}))
    req = urlrequest.Request(url, headers={"User-Agent": "fleetctl-probe", "Accept": "application/json, */*"})
    start = time.perf_counter()
    try:
        try:
            resp = opener.open(req, timeout=timeout)
        except urlerror.HTTPError as exc:  # 4xx/5xx still carry a status and a body
            resp = exc
        try:
            body = resp.read(max_body + 1)
        finally:
            resp.close()
    except Exception as exc:
        answer.update(classify(exc, timeout, url))
        answer["latency_ms"] = round((time.perf_counter() - start) * 1000, 2)
        return answer
    answer["latency_ms"] = round((time.perf_counter() - start) * 1000, 2)
    answer["status"] = resp.getcode() if hasattr(resp, "getcode") else resp.code
    answer["reason"] = getattr(resp, "reason", None) or getattr(resp, "msg", None)
    answer["content_type"] = resp.headers.get("Content-Type")
    charset = resp.headers.get_content_charset() or "utf-8"
    answer.update(describe_body(body, max_body, charset, answer["content_type"] or "", max_text))
    return answer


def classify(exc, timeout, url):
    """A network failure as a short kind and a sentence."""
    reason = exc.reason if isinstance(exc, urlerror.URLError) else exc
    where = urlparse.urlsplit(url).netloc
    if isinstance(reason, ConnectionRefusedError):
        return {"error_kind": "refused", "error": "connection refused: nothing listens on %s" % where}
    if isinstance(reason, socket.timeout) or "timed out" in str(reason):
        return {"error_kind": "timeout", "error": "no answer from %s within %gs" % (where, timeout)}
    if isinstance(reason, socket.gaierror):
        return {"error_kind": "dns", "error": "cannot resolve %s: %s" % (where, reason)}
    if isinstance(reason, ConnectionResetError):
        return {"error_kind": "reset", "error": "connection reset by %s" % where}
    return {"error_kind": "error", "error": "%s: %s" % (type(reason).__name__, reason)}


def describe_body(body, max_body, charset, content_type, max_text):
    truncated = len(body) > max_body
    body = body[:max_body]
    out = {"size": len(body), "truncated": truncated, "json": None, "has_json": False, "json_error": None,
           "text": None}
    try:
        text = body.decode(charset, "replace")
    except LookupError:  # an unknown charset name
        text = body.decode("utf-8", "replace")
    looks_json = "json" in content_type.lower() or text.lstrip()[:1] in ("{", "[")
    if looks_json and not truncated and text.strip():
        try:
            out["json"] = json.loads(text)
            out["has_json"] = True
            return out
        except ValueError as exc:
            out["json_error"] = "body is not valid JSON: %s" % exc
    elif looks_json and truncated:
        out["json_error"] = "body larger than %d bytes: not parsed" % max_body
    out["text"] = text[:max_text]
    out["truncated"] = truncated or len(text) > max_text
    return out
