"""One HTTP request from this host (``uri``): any method, a body, headers. Stdlib only, Python >= 3.8.

Proxies from the environment are ignored, as in http_get. A refused connection or a timeout is an
answer ("error_kind"), never a crash; the status is whatever the server said (4xx/5xx included).

params: url, method, body (text or None), headers ({name: value}), timeout, max_body, max_text
"""
# fleetctl-include: http_get

import time
from urllib import error as urlerror
from urllib import request as urlrequest


def main(params):
    url = params["url"]
    timeout = float(params.get("timeout") or 30)
    max_body = int(params.get("max_body") or 1024 * 1024)
    body = params.get("body")
    data = body.encode("utf-8") if body is not None else None
    headers = dict(params.get("headers") or {})
    headers.setdefault("User-Agent", "fleetctl-uri")
    req = urlrequest.Request(url, data=data, method=params.get("method") or "GET", headers=headers)
    opener = urlrequest.build_opener(urlrequest.ProxyHandler({}))
    answer = {"url": url, "status": None, "error_kind": None, "error": None}
    start = time.perf_counter()
    try:
        try:
            resp = opener.open(req, timeout=timeout)
        except urlerror.HTTPError as exc:
            resp = exc
        try:
            raw = resp.read(max_body + 1)
        finally:
            resp.close()
    except Exception as exc:
        answer.update(classify(exc, timeout, url))
        return answer
    answer["elapsed_ms"] = round((time.perf_counter() - start) * 1000, 2)
    answer["status"] = resp.getcode() if hasattr(resp, "getcode") else resp.code
    ctype = resp.headers.get("Content-Type") or ""
    answer["content_type"] = ctype
    answer.update(describe_body(raw, max_body, resp.headers.get_content_charset() or "utf-8", ctype,
                                int(params.get("max_text") or 4000)))
    return answer
